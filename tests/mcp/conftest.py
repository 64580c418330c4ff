"""Each MCP test starts like a cold start: nothing remembered about any server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepagent.tools.mcp_session import forget_all


@pytest.fixture(autouse=True)
def _cold_start() -> Iterator[None]:
    forget_all()
    yield
    forget_all()
