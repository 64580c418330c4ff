"""The store contract suite runs against every implementation registered in ``STORE_FACTORIES``.

A factory is an async context manager yielding a fresh, empty ``(ConversationStore, StateStore)`` pair.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from stepagent.stores.base import ConversationStore, StateStore
from stepagent.stores.memory import memory_stores
from tests.conftest import dynamo_store_pair

StorePair = tuple[ConversationStore, StateStore]


@asynccontextmanager
async def memory_factory() -> AsyncIterator[StorePair]:
    yield memory_stores()


STORE_FACTORIES: dict[str, Callable[[], AbstractAsyncContextManager[StorePair]]] = {
    "memory": memory_factory,
    "dynamodb": dynamo_store_pair,
}


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[StorePair]:
    async with STORE_FACTORIES[request.param]() as pair:
        yield pair
