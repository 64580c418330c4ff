"""Keys that every log line of the current task carries (``thread_id``, ``message_ids``, ...).

The AWS binding's modules log through the standard library (``logging.getLogger(__name__)``); the handler
edge (:mod:`stepagent.aws.lambda_entry`) configures powertools' JSON logger once, on the ``stepagent``
logger those records reach, and installs :class:`LogKeys` on its handler. A module says which keys its
following lines carry with :func:`append_keys`; they live in a context variable, so each asyncio task (the
worker runs one per thread) keeps its own and a key set in one task never labels another task's lines.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

_KEYS: ContextVar[dict[str, Any] | None] = ContextVar("stepagent_log_keys", default=None)


def append_keys(**keys: Any) -> None:
    """Add ``keys`` to every later log line of this task (and of tasks it starts from now on)."""
    _KEYS.set({**(_KEYS.get() or {}), **keys})


class LogKeys(logging.Filter):
    """Puts the task's keys on each record as attributes (powertools' formatter prints them as fields); a
    key the call itself gave in ``extra`` wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_KEYS.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
