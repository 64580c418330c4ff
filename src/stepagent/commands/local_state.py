"""Commands on the local state that ``stepagent run --state-dir DIR`` keeps: the ``--state-dir`` option,
and running a command on the embedded stack loaded from that directory (saved back when the command
changes it). A directory that holds no saved state is refused with a message saying how to make one."""

from __future__ import annotations

import argparse
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from stepagent.errors import ConfigurationError


def add_state_dir(parser: argparse.ArgumentParser, help: str) -> None:
    """Add ``--state-dir DIR`` (default: ``$STEPAGENT_STATE_DIR``) to ``parser``."""
    parser.add_argument(
        "--state-dir", default=os.environ.get("STEPAGENT_STATE_DIR"), metavar="DIR", help=help
    )


async def on_local_state(state_dir: str, save: bool, command: Coroutine[Any, Any, int]) -> int:
    """Run ``command`` on the embedded stack loaded from ``state_dir`` (saved back when ``save``)."""
    from stepagent.devstack.chat import LOCAL_PREFIX
    from stepagent.devstack.snapshot import has_snapshot, local_state

    if not has_snapshot(Path(state_dir)):
        command.close()
        raise ConfigurationError(
            f"{state_dir} holds no local state (`stepagent run --state-dir {state_dir}` keeps it)"
        )
    async with local_state(state_dir, save=save, prefix=LOCAL_PREFIX):
        return await command
