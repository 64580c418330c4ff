"""Lifecycle commands under DynamoDB ``TransactionConflict`` (another transaction touched an item at the same
moment): ``import`` and ``rewind`` retry through the one backoff rule instead of giving up, on moto with the
conflicts injected in front of the real client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from stepagent.backoff import Backoff
from stepagent.errors import TransactionConflictError
from stepagent.ids import derived_id
from stepagent.lifecycle import import_tree
from stepagent.lifecycle.commands import retry_conflicts
from stepagent.lifecycle.rewind import rewind_thread
from tests.conftest import DynamoEnv
from tests.lifecycle import build_tree, export_to, rename, transcript


class ConflictingClient:
    """Forwards to a real client; the first ``conflicts`` ``TransactWriteItems`` are cancelled as DynamoDB
    cancels a transaction that collides with another one (nothing written)."""

    def __init__(self, inner: Any, conflicts: int) -> None:
        self._inner, self.conflicts, self.calls = inner, conflicts, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name != "transact_write_items":
            return method

        async def transact(**kwargs: Any) -> Any:
            self.calls += 1
            if self.calls <= self.conflicts:
                reasons = [{"Code": "TransactionConflict"}] + [{"Code": "None"}] * (
                    len(kwargs["TransactItems"]) - 1
                )
                raise ClientError(
                    {
                        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
                        "CancellationReasons": reasons,
                    },
                    "TransactWriteItems",
                )
            return await method(**kwargs)

        return transact


async def no_sleep(seconds: float) -> None:
    pass


async def test_an_import_retries_conflicts_and_completes(dynamo: DynamoEnv, tmp_path: Path) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    original = await transcript(conv, ids["root"])

    # One conflict is enough to fail a bare import: what the command did before.
    bare_conv, bare_state = dynamo.stores(client=ConflictingClient(dynamo.client, 1))
    with pytest.raises(TransactionConflictError):
        await import_tree(bare_conv, bare_state, path, new_root="copy-bare")

    client = ConflictingClient(dynamo.client, 3)
    retried_conv, retried_state = dynamo.stores(client=client)
    result = await retry_conflicts(
        lambda: import_tree(retried_conv, retried_state, path, new_root="copy"), sleep=no_sleep
    )
    assert result.root_thread_id == "copy" and client.calls > 3
    ids_map = {ids["root"]: "copy"} | {
        v: derived_id("import", "copy", v) for k, v in ids.items() if k != "root"
    }
    assert await transcript(conv, "copy") == rename(original, ids_map)


async def test_a_rewind_retries_conflicts_and_a_lasting_conflict_is_reported(dynamo: DynamoEnv) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state)
    before = await conv.get_thread(ids["root"])
    assert before is not None and before.tail > 2

    lasting = ConflictingClient(dynamo.client, 100)
    lasting_conv, lasting_state = dynamo.stores(client=lasting)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with pytest.raises(TransactionConflictError):
        await retry_conflicts(
            lambda: rewind_thread(lasting_conv, lasting_state, ids["root"], 2),
            backoff=Backoff(attempts=3, base=0.2),
            sleep=sleep,
        )
    assert len(sleeps) == 2 and lasting.calls == 9  # three runs (of three tries each), then it is reported
    assert (await conv.get_thread(ids["root"])) == before  # nothing of a cancelled transaction was written

    client = ConflictingClient(dynamo.client, 2)
    retried_conv, retried_state = dynamo.stores(client=client)
    result = await retry_conflicts(
        lambda: rewind_thread(retried_conv, retried_state, ids["root"], 2), sleep=no_sleep
    )
    assert result.effective <= 2 and result.dropped_rows > 0
    after = await conv.get_thread(ids["root"])
    assert after is not None and after.tail == result.effective
