"""The ``LIVE`` item of a thread (state table): what its current step is doing, for clients that poll.

Nothing here is history. It is a per-thread scratch item that a client reads with the thread's head (one
consistent ``BatchGetItem`` for a whole thread tree) to show progress that no commit has made yet:

- **Partial text.** ``version`` is the head version the partial turn follows; ``text`` the assistant text
  streamed so far (only its last :data:`MAX_PARTIAL_CHARS` characters, ``offset`` counting those
  dropped), ``phase`` what the model is doing (``thinking``, ``writing``, ``calling`` a ``tool``,
  ``retrying``). The text is shown only while the head is still at ``version``: the commit that makes it
  history moves the head on, so a reader never mistakes partial text for committed text, even if clearing
  it (:meth:`LiveStore.clear`, after the step) fails or is late.
- **Notices.** The last :data:`NOTICES_KEPT` notices (``error``, ``oauth_required`` and ``limit_reached``
  events, as compact JSON: :mod:`stepagent.notices`) in ``notices``, oldest first, with ``notice_seq``
  counting every notice ever recorded, so a reader can tell which are new (one ``UpdateItem`` per notice;
  two more when the list is full and the oldest goes). :func:`decode_live` reads each by the rule of
  :func:`~stepagent.notices.read_notice`; one it skips still counts, so it never makes an older notice
  look new.

Every write is a single ``UpdateItem`` counted in the :class:`~stepagent.stores.metrics.StoreMetrics` of
the :class:`~stepagent.stores.dynamodb.io.DynamoIo` it is given; the item carries a TTL (``expires_at``,
refreshed by every write), so an abandoned one disappears on its own.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepagent.errors import StoreError
from stepagent.formats import item_version
from stepagent.notices import LiveNotice, Notice, read_notice
from stepagent.stores.dynamodb.io import (
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    item_key,
    n_attr,
    s_attr,
    update,
)

if TYPE_CHECKING:  # the types-aiobotocore stubs: development only
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef

LIVE_SK = "LIVE"
#: The item outlives any step; the TTL only reclaims threads nobody talks to any more.
LIVE_TTL_S = 7 * 24 * 3600
#: How much partial text is kept (its end: what a person is reading).
MAX_PARTIAL_CHARS = 32_000
NOTICES_KEPT = 20
PHASES = ("thinking", "writing", "calling", "retrying")


@dataclass(frozen=True, slots=True)
class LiveState:
    """A decoded ``LIVE`` item (all fields empty when there is none)."""

    version: int | None = None
    text: str = ""
    offset: int = 0
    phase: str | None = None
    tool: str | None = None
    notices: tuple[LiveNotice, ...] = ()
    notice_seq: int = 0
    #: The sequence number of each of ``notices`` (empty: numbered one by one up to ``notice_seq``).
    notice_numbers: tuple[int, ...] = ()

    def partial_after(self, head_version: int) -> bool:
        """Whether the partial turn is current for a head at ``head_version`` (not yet committed)."""
        return self.version is not None and self.version == head_version and self.phase is not None

    def new_notices(self, seen_seq: int) -> list[LiveNotice]:
        """Notices recorded after the first ``seen_seq`` (those still kept)."""
        return [notice for _, notice in self.numbered_notices(seen_seq)]

    def numbered_notices(self, seen_seq: int) -> list[tuple[int, LiveNotice]]:
        """:meth:`new_notices` with each one's number (its place in the thread's count of notices): a
        reader that records how far it got records the number, not how many it was given, since notices
        that could not be read are skipped and the oldest fall off the kept list."""
        numbers = self.notice_numbers or range(self.notice_seq - len(self.notices) + 1, self.notice_seq + 1)
        return [
            (number, notice)
            for notice, number in zip(self.notices, numbers, strict=True)
            if number > seen_seq
        ]


def decode_live(item: DynamoItem | None) -> LiveState:
    """The ``LIVE`` item as a :class:`LiveState` (an empty state when there is none)."""
    if not item:
        return LiveState()
    item_version(item, f"the live state of thread {item.get('pk', {}).get('S')}")

    def number(name: str) -> int | None:
        return int(item[name]["N"]) if name in item else None

    def text(name: str) -> str | None:
        return str(item[name]["S"]) if name in item else None

    stored = item.get("notices", {}).get("L", [])
    seq = number("notice_seq") or 0
    notices: list[LiveNotice] = []
    numbers: list[int] = []
    for position, raw in enumerate(stored):
        notice = read_notice(raw["S"]) if "S" in raw else None
        if notice is not None:
            notices.append(notice)
            numbers.append(seq - len(stored) + 1 + position)
    return LiveState(
        version=number("version"),
        text=text("text") or "",
        offset=number("offset") or 0,
        phase=text("phase"),
        tool=text("tool"),
        notices=tuple(notices),
        notice_seq=seq,
        notice_numbers=tuple(numbers),
    )


def live_key(thread_id: str) -> DynamoItem:
    """The key of a thread's ``LIVE`` item in the state table."""
    return item_key(thread_id, LIVE_SK)


def _expires() -> AttributeValueTypeDef:
    return n_attr(int(time.time()) + LIVE_TTL_S)


class LiveStore:
    """Writes ``LIVE`` items of one state table."""

    def __init__(self, io: DynamoIo, state_table: str) -> None:
        self.io = io
        self.table = state_table

    async def show(self, thread_id: str, version: int, text: str, phase: str, tool: str | None) -> None:
        """Overwrite the partial turn: ``text`` streamed after head version ``version``."""
        offset = max(0, len(text) - MAX_PARTIAL_CHARS)
        names = {
            "#v": "version",
            "#x": "text",
            "#o": "offset",
            "#p": "phase",
            "#t": "tool",
            "#e": "expires_at",
        }
        values: DynamoItem = {
            ":v": n_attr(version),
            ":x": s_attr(text[offset:]),
            ":o": n_attr(offset),
            ":p": s_attr(phase),
            ":e": _expires(),
        }
        expression = "SET #v = :v, #x = :x, #o = :o, #p = :p, #e = :e"
        if tool is not None:
            values[":t"] = s_attr(tool)
            expression += ", #t = :t"
        else:
            expression += " REMOVE #t"
        await self.io.write(update(self.table, live_key(thread_id), expression, names, values))

    async def clear(self, thread_id: str) -> None:
        """Remove the partial turn (notices stay)."""
        names = {"#v": "version", "#x": "text", "#o": "offset", "#p": "phase", "#t": "tool", "#pk": "pk"}
        write = update(
            self.table,
            live_key(thread_id),
            "REMOVE #v, #x, #o, #p, #t",
            names,
            {},
            ConditionExpression="attribute_exists(#pk)",
        )
        with contextlib.suppress(ConditionFailed):  # nothing to clear (never written, or TTL'd)
            await self.io.write(write)

    async def notice(self, thread_id: str, notice: Notice) -> None:
        """Append ``notice`` (kept: the last :data:`NOTICES_KEPT`)."""
        one: AttributeValueTypeDef = {
            "L": [s_attr(json.dumps(notice, ensure_ascii=False, separators=(",", ":")))]
        }
        names = {"#n": "notices", "#s": "notice_seq", "#e": "expires_at"}
        values: DynamoItem = {
            ":one": one,
            ":none": {"L": []},
            ":z": n_attr(0),
            ":inc": n_attr(1),
            ":e": _expires(),
            ":max": n_attr(NOTICES_KEPT),
        }
        grow = update(
            self.table,
            live_key(thread_id),
            "SET #n = list_append(if_not_exists(#n, :none), :one), #s = if_not_exists(#s, :z) + :inc, #e = :e",
            names,
            values,
            ConditionExpression="attribute_not_exists(#n) OR size(#n) < :max",
        )
        for _ in range(3):
            try:
                await self.io.write(grow)
                return
            except ConditionFailed:
                pass
            # Full: drop the oldest notice, then append (the sequence number keeps counting).
            drop = update(
                self.table,
                live_key(thread_id),
                "REMOVE #n[0]",
                {"#n": "notices"},
                {":max": n_attr(NOTICES_KEPT)},
                ConditionExpression="size(#n) >= :max",
            )
            with contextlib.suppress(ConditionFailed):  # another writer made room first
                await self.io.write(drop)
        raise StoreError(f"could not record a notice for thread {thread_id}: its notice list kept changing")
