"""Lifecycle commands under transient DynamoDB failures, on moto with the faults injected in front of the real
client: ``import`` and ``rewind`` retry a ``TransactionConflict`` (another transaction touched an item at the
same moment), ``export`` retries throttling and 5xx answers, all through the one backoff rule, instead of
giving up; an export that does give up leaves no partial file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from stepagent.aws.transient import retry_transient
from stepagent.backoff import Backoff
from stepagent.errors import StoreError, TransactionConflictError
from stepagent.ids import derived_id
from stepagent.lifecycle import export_lines, import_tree
from stepagent.lifecycle.commands import register, run_lifecycle_command
from stepagent.lifecycle.rewind import rewind_thread
from tests.conftest import DynamoEnv
from tests.faults import Faults
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
    result = await retry_transient(
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
        await retry_transient(
            lambda: rewind_thread(lasting_conv, lasting_state, ids["root"], 2),
            backoff=Backoff(attempts=3, base=0.2),
            sleep=sleep,
        )
    assert len(sleeps) == 2 and lasting.calls == 9  # three runs (of three tries each), then it is reported
    assert (await conv.get_thread(ids["root"])) == before  # nothing of a cancelled transaction was written

    client = ConflictingClient(dynamo.client, 2)
    retried_conv, retried_state = dynamo.stores(client=client)
    result = await retry_transient(
        lambda: rewind_thread(retried_conv, retried_state, ids["root"], 2), sleep=no_sleep
    )
    assert result.effective <= 2 and result.dropped_rows > 0
    after = await conv.get_thread(ids["root"])
    assert after is not None and after.tail == result.effective


def throttle_sessions(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """Every AWS session the command opens gets ``faults`` (its clients are created from it)."""
    import stepagent.aws.clients as clients

    original = clients.aws_session

    def session(*args: Any, **kwargs: Any) -> Any:
        opened = original(*args, **kwargs)
        faults.attach(opened)
        return opened

    monkeypatch.setattr(clients, "aws_session", session)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


async def test_export_rides_out_throttling_and_never_writes_a_partial_file(
    settings_env: DynamoEnv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conv, state = settings_env.stores()
    ids = await build_tree(conv, state)
    expected = (await export_to(conv, state, ids["root"], tmp_path / "clean.jsonl")).read_text()

    # Without the retry, the first throttled read ends the export.
    Faults({"Query": 1}).attach(settings_env.client)
    with pytest.raises(StoreError, match="ThrottlingException"):
        _ = [line async for line in export_lines(conv, state, ids["root"])]

    # A pass that fails after its first rows were read is run again from the start: the file is whole,
    # with no line twice.
    faults = Faults({"GetItem": 1, "Query": 2}, after={"Query": 3})
    throttle_sessions(monkeypatch, faults)
    monkeypatch.setattr("stepagent.aws.transient.TRANSIENT_BACKOFF", Backoff(attempts=5, base=0.01))
    out = tmp_path / "tree.jsonl"
    assert await run_lifecycle_command(parse("export", ids["root"], "--output", str(out))) == 0
    assert faults.injected == 3 and out.read_text() == expected
    assert await run_lifecycle_command(parse("export", ids["root"])) == 0  # to stdout, faults spent
    assert capsys.readouterr().out == expected
    assert [n for n in os.listdir(tmp_path) if n.startswith(".stepagent-export-")] == []


async def test_export_under_lasting_throttling_fails_and_leaves_the_old_file(
    settings_env: DynamoEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv, state = settings_env.stores()
    ids = await build_tree(conv, state)
    out = tmp_path / "tree.jsonl"
    out.write_text("the previous export\n")
    faults = Faults({"Query": 100}, code="ServiceUnavailable", status=503)
    throttle_sessions(monkeypatch, faults)
    monkeypatch.setattr("stepagent.aws.transient.TRANSIENT_BACKOFF", Backoff(attempts=3, base=0.01))
    with pytest.raises(StoreError, match="ServiceUnavailable"):
        await run_lifecycle_command(parse("export", ids["root"], "--output", str(out)))
    assert out.read_text() == "the previous export\n"
    assert sorted(os.listdir(tmp_path)) == ["tree.jsonl"]
