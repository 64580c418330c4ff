"""The memory gate's trap, loaded into a ``stepagent api`` process by tests/api/test_memory.py: every event
stream keeps its own copy of the conversation's history (read from ``TRAP_HISTORY_FILE``), the mistake
the gate exists to catch."""

from __future__ import annotations

import json
import os
from typing import Any

from stepagent.api.events import TreeEvents

_HISTORY = open(os.environ["TRAP_HISTORY_FILE"], encoding="utf-8").read()  # noqa: SIM115
_original = TreeEvents.__init__


def _buffering_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _original(self, *args, **kwargs)
    self.trap_history = json.loads(_HISTORY)


TreeEvents.__init__ = _buffering_init  # type: ignore[method-assign]
