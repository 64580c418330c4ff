"""Tools of the offline demo. ``get_time`` is an ordinary asynchronous function tool: in ``stepagent run``
it travels through the tool queue and the tool runner, like any tool you write with ``@tool``."""

from __future__ import annotations

from datetime import UTC, datetime

from stepagent.tools.functions import tool


@tool
def get_time() -> str:
    """The current date and time in UTC (ISO 8601)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


toolset = [get_time]
