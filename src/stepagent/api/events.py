"""A thread tree's output events, read from the stores, with a resume token after each one.

**Where the events come from.** Not from the output queue: it is one shared FIFO that a single consumer
drains, so it cannot serve many browsers, nor replay what a dropped connection missed. The committed events
are derived from what the worker committed, with the very ids the output queue carries:

- ``text``, ``tool_call``, ``tool_result``, ``event`` — one per stored history row
  (:func:`stepagent.outputs.build.row_events`), in the thread's row order;
- ``turn_complete`` — one per usage record that says the turn was complete, placed right after the last row
  of its commit (the record keeps the thread's tail at that commit);
- the notices (errors, sign-in links, limit stops, any other kind) — from the thread's ``LIVE``
  item's notices, when they are recorded (only those recorded after the stream began, as for any
  watcher); a notice of a kind this version does not read is forwarded as stored
  (:class:`OtherNoticeInThread`);
- ``text_delta`` (not an output-queue event) — the part of the ``LIVE`` item's partial text not sent yet,
  only while the head is still at the version that text follows (a commit makes it a ``text`` event).

Each carries the thread context after its own keys (:func:`stepagent.outputs.events.in_thread`;
``text_delta`` has ``thread_id`` and ``root_thread_id`` but no ``event_id`` and no ``metadata``):
:data:`StreamEvent` is their union.

**The resume token** (the SSE ``id:``) is the stream's position after the event: per thread of the tree,
the last row order sent, the head version and the last ``turn_complete`` version fully sent, the notices
seen, and the partial text's (version, characters sent). Everything it names is stored durably, so a new
stream given the token (``Last-Event-ID`` or ``?after=``), on any process, yields exactly the events after
it: none lost, none repeated. It is signed (HMAC-SHA256 over the root's id and the positions, with the
deployment's resume key, :class:`ResumeTokens`), so a client can neither name threads of its own choosing
nor alter a position; and on resume only the threads the store records under the URL's thread are kept
(:func:`tree_positions`) — a token never widens what a stream reads. Per thread the order is the commit order; threads of a tree interleave as
they were observed. Partial text is not durable: a resumed stream continues the same partial turn from
the character it reached, and once that turn is committed it sends the committed ``text`` instead.

**Cost.** Each poll is one consistent ``BatchGetItem`` of the ``HEAD`` and ``LIVE`` items of the tree's
open threads; rows, usage records and children are read only for a thread whose head moved since the
token. Polls start :data:`BUSY_INTERVAL` apart while the tree works (a partial turn is being written, or
a turn is not complete), for :data:`BUSY_GRACE` seconds after the stream opens and after this process sent
the tree a message (the worker is about to start), and :data:`IDLE_INTERVAL` apart otherwise; streams of
the same tree in one process share their polls (:class:`SharedReads`), so an idle conversation costs at
most one read a second however many streams watch it. A stream holds only its position (a few numbers
per thread) — never the history it has sent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from stepagent.client.watch import StoreReader
from stepagent.core.elicitation import read_question
from stepagent.notices import KEPT_NOTICE_KINDS, WAITING_NOTICE_KINDS, Notice, UnknownNotice
from stepagent.outputs.build import record_events, record_notices, row_events
from stepagent.outputs.events import (
    OtherNoticeInThread,
    OutputEvent,
    OutputEventInThread,
    TextDeltaEvent,
    ThreadContext,
    in_thread,
)
from stepagent.stores.base import ThreadInfo, UsageRecord
from stepagent.stores.dynamodb.layout import info_from_item
from stepagent.stores.dynamodb.live import LiveState, decode_live

#: Seconds between two polls of an idle tree (the cost floor of a connected client).
IDLE_INTERVAL = 1.0
#: Seconds between the starts of two polls while the tree works: shorter than the worker's live-text
#: interval (:data:`stepagent.aws.live.LIVE_INTERVAL_S`), so every write of the partial turn is its own
#: ``text_delta`` and the first text is out within this long of its write.
BUSY_INTERVAL = 0.15
#: Seconds a stream polls at the busy pace after it opens, or after a message was sent to its tree, before
#: the tree shows any work (the worker taking the message, the model starting).
BUSY_GRACE = 5.0
MAX_TOKEN_CHARS = 16_384
#: How many head versions back a ``LIVE`` notice's usage record is looked for (it is the same step's).
KEPT_NOTICE_LOOKBACK = 8


StreamEvent = OutputEventInThread | OtherNoticeInThread | TextDeltaEvent
"""One event of the stream (the SSE ``event:`` is its ``type``)."""


class BadToken(ValueError):
    """A resume token that this server did not make (or that was altered)."""


@dataclass(slots=True)
class Position:
    """Where a stream is in one thread."""

    order: int = 0  # the last row sent
    version: int = 0  # every row and turn_complete up to this head version is sent
    usage: int = 0  # the last turn_complete (usage record version) sent
    notices: int | None = None  # notices seen (None: not read yet; those before the stream are skipped)
    partial_version: int = -1  # the head version the partial text sent follows
    partial_chars: int = 0  # characters of that partial text sent
    part: int = 0  # events of the usage record after ``usage`` already sent (its notices, then turn_complete)
    row_part: int = 0  # events of the row after ``order`` already sent (a call, then approval_required)

    def as_list(self) -> list[int | None]:
        values: list[int | None] = [
            self.order,
            self.version,
            self.usage,
            self.notices,
            self.partial_version,
            self.partial_chars,
        ]
        if self.row_part:
            return [*values, self.part, self.row_part]
        return [*values, self.part] if self.part else values


class ResumeTokens:
    """Makes and checks resume tokens: ``<positions, base64url JSON>.<HMAC-SHA256, base64url>``, the MAC
    over the root's id and the positions, so a token is valid only for the stream of the root it was made
    for and only as this deployment's API made it."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, root: str, payload: str) -> str:
        digest = hmac.new(self._key, f"{root}\x00{payload}".encode(), hashlib.sha256).digest()
        return _b64(digest)

    def encode(self, root: str, positions: dict[str, Position]) -> str:
        """The resume token of ``positions`` in the tree of ``root`` (opaque to clients)."""
        raw = json.dumps({t: p.as_list() for t, p in positions.items()}, separators=(",", ":"))
        payload = _b64(raw.encode())
        return f"{payload}.{self._mac(root, payload)}"

    def decode(self, token: str, root: str) -> dict[str, Position]:
        """The positions a token holds; :class:`BadToken` when this API did not make it for ``root``'s
        stream (or it was altered)."""
        if len(token) > MAX_TOKEN_CHARS:
            raise BadToken("the resume token is too long")
        payload, _, mac = token.partition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(root, payload).encode()):
            raise BadToken(
                "the resume token (Last-Event-ID or after) is not one this API sent for this thread's stream"
            )
        try:
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            positions = {}
            for thread, values in data.items():
                if len(values) in (6, 7):  # no part of a record or row sent yet
                    values = [*values, 0, 0][:8]
                order, version, usage, notices, pv, pc, part, row_part = values
                for number in (order, version, usage, pv, pc, part, row_part):
                    if not isinstance(number, int) or isinstance(number, bool):
                        raise TypeError
                if notices is not None and not isinstance(notices, int):
                    raise TypeError
                positions[str(thread)] = Position(order, version, usage, notices, pv, pc, part, row_part)
        except (ValueError, TypeError, AttributeError, binascii.Error) as error:
            raise BadToken("the resume token (Last-Event-ID or after) cannot be read") from error
        if root not in positions:
            raise BadToken("the resume token belongs to another thread")
        return positions


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


async def tree_positions(
    reader: StoreReader, root: str, positions: dict[str, Position]
) -> dict[str, Position]:
    """``positions`` without the threads the store does not record under ``root`` (each thread's head names
    its parent; a thread is kept when its parent is ``root`` or a kept thread): a resumed stream reads only
    what a fresh stream of ``root`` could reach, whether ``root`` is a conversation's root or a child."""
    others = [thread for thread in positions if thread != root]
    if not others:
        return positions
    parents = {
        thread: info_from_item(head).parent_id
        for thread, (head, _) in (await reader.heads_and_live(others)).items()
        if head is not None
    }
    inside = {root}
    grew = True
    while grew:
        found = {thread for thread, parent in parents.items() if thread not in inside and parent in inside}
        inside |= found
        grew = bool(found)
    return {thread: pos for thread, pos in positions.items() if thread in inside}


@dataclass(frozen=True, slots=True)
class View:
    """One thread as a poll read it: its head (``None``: no such thread yet) and its ``LIVE`` item."""

    info: ThreadInfo | None = None
    live: LiveState = field(default_factory=LiveState)


class SharedReads:
    """Coalesces the polls of streams watching the same threads: a read younger than ``max_age`` (or
    still in flight) is reused, so N streams of one tree cost one read per interval, not N."""

    def __init__(self, reader: StoreReader) -> None:
        self.reader = reader
        self._reads: dict[tuple[str, ...], tuple[float, asyncio.Future[Any]]] = {}
        self._expected: dict[str, float] = {}  # root thread -> until when its streams poll at the busy pace

    def expect(self, root: str) -> None:
        """A message was just sent to ``root``'s tree: its streams poll at the busy pace for a while."""
        now = time.monotonic()
        if len(self._expected) > 256:
            self._expected = {k: v for k, v in self._expected.items() if v > now}
        self._expected[root] = now + BUSY_GRACE

    def expecting(self, root: str) -> bool:
        return self._expected.get(root, 0.0) > time.monotonic()

    async def views(self, threads: Iterable[str], max_age: float) -> dict[str, View]:
        """Each thread's head and ``LIVE`` item, decoded once for every stream that shares the read."""
        key = tuple(sorted(threads))
        now = time.monotonic()
        cached = self._reads.get(key)
        if cached is not None and (not cached[1].done() or now - cached[0] < max_age):
            return dict(await asyncio.shield(cached[1]))
        if len(self._reads) > 256:  # forget the old reads of trees nobody watches any more
            self._reads = {k: v for k, v in self._reads.items() if now - v[0] < 5 * IDLE_INTERVAL}
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reads[key] = (now, future)
        try:
            raw = await self.reader.heads_and_live(key)
            result = {
                thread: View(info_from_item(head) if head else None, decode_live(live))
                for thread, (head, live) in raw.items()
            }
        except BaseException as error:
            self._reads.pop(key, None)
            future.set_exception(error)
            future.exception()  # retrieved: the waiters re-raise it
            raise
        future.set_result(result)
        return dict(result)


_NOTHING = View()


class TreeEvents:
    """Follows the thread tree of ``root`` from ``positions`` (empty: from the start; a resumed stream's
    come from :meth:`ResumeTokens.decode` and :func:`tree_positions`); :meth:`poll` yields
    ``(resume token, event)``, each token signed by ``tokens``."""

    def __init__(
        self,
        reads: SharedReads,
        root: str,
        positions: dict[str, Position] | None = None,
        *,
        tokens: ResumeTokens,
        follow: bool = False,
        message_id: str | None = None,
    ) -> None:
        self.reads = reads
        self.tokens = tokens
        self.reader = reads.reader
        self.root = root
        self.positions: dict[str, Position] = positions if positions else {root: Position()}
        self.follow = follow
        self.ended = False
        self.busy = True
        self._metadata: Any = None
        # ``message_id`` without a token: the stream starts at the row that message began (found by
        # :meth:`_locate`, waiting for it) and ends with the root's next ``turn_complete``.
        self._locating = message_id if message_id is not None and not positions else None
        self._turn_start: int | None = None  # the root order the turn of ``message_id`` starts at
        self._scanned = 0  # root rows already searched for it
        self._fast_until = time.monotonic() + BUSY_GRACE
        self._polled_at = time.monotonic()

    def token(self) -> str:
        return self.tokens.encode(self.root, self.positions)

    @property
    def pace(self) -> float:
        """Seconds from the start of one poll to the start of the next."""
        fast = self.busy or time.monotonic() < self._fast_until or self.reads.expecting(self.root)
        return BUSY_INTERVAL if fast else IDLE_INTERVAL

    @property
    def interval(self) -> float:
        """Seconds to wait before the next poll (its :attr:`pace` less the time the last poll took)."""
        return max(0.0, self.pace - (time.monotonic() - self._polled_at))

    async def poll(self) -> AsyncIterator[tuple[str, StreamEvent]]:
        """One round of reads, and the events it found. Threads discovered on the way (a child spawned
        since the last poll) are read in the same round, so a turn's events are all out before it ends."""
        if self._locating is not None and not await self._locate(self._locating):
            self.busy = True  # the message is on its way to the worker: look again soon
            return
        pending = list(self.positions)
        self._polled_at = time.monotonic()
        max_age = self.pace * 0.9
        busy = False
        root_view: View | None = None
        while pending:
            read = await self.reads.views(pending, max_age=max_age)
            threads, pending = pending, []
            for thread in threads:
                view = read.get(thread, _NOTHING)
                if thread == self.root:
                    root_view = view
                info = view.info
                busy = busy or view.live.phase is not None
                if info is not None and not info.closed and info.turn_complete is False:
                    busy = True
                known = set(self.positions)
                async for event in self._thread_events(thread, view):
                    yield event
                pending.extend(t for t in self.positions if t not in known)
            max_age = 0.0
        self.busy = busy
        root = root_view.info if root_view is not None else None
        if self._turn_start is not None:
            return  # the turn's own end (see _turn_complete) ends this stream
        if (
            not self.follow
            and root is not None
            and root.turn_complete
            and self.positions[self.root].version == root.version
        ):
            # The root's turn is over and everything committed up to it is out.
            self.ended = True

    async def _thread_events(self, thread: str, view: View) -> AsyncIterator[tuple[str, StreamEvent]]:
        pos = self.positions[thread]
        info = view.info
        if info is not None and info.version != pos.version:
            async for event in self._catch_up(thread, info, pos):
                yield event
            for child in await self.reader.conversation.children(thread):
                if child.thread_id not in self.positions and self._in_turn(thread, child):
                    self.positions[child.thread_id] = Position(notices=0)
            pos.version = info.version
        live = view.live
        if pos.notices is None:
            async for event in self._still_waiting(thread, info, live):
                yield event
            pos.notices = live.notice_seq
        else:
            for number, notice in live.numbered_notices(pos.notices):
                pos.notices = number  # the resume token names this notice, whatever was skipped before it
                if await self._kept(thread, info, notice):
                    continue  # the step kept it with the thread: sent from its usage record, in order
                yield await self._emit(thread, notice)
            pos.notices = max(pos.notices, live.notice_seq)
        version = info.version if info is not None else 0
        if live.phase is not None and live.version == version and live.text:
            delta = self._delta(pos, version, live)
            if delta:
                delta_event: TextDeltaEvent = {
                    "type": "text_delta",
                    "thread_id": thread,
                    "root_thread_id": self.root,
                    "text": delta,
                }
                yield self.token(), delta_event

    async def _still_waiting(
        self, thread: str, info: ThreadInfo | None, live: LiveState
    ) -> AsyncIterator[tuple[str, StreamEvent]]:
        """What a fresh stream owes a person from before it began: the sign-in link or question a call of
        this thread still waits on (the latest per call; none once the call has its result). Other notices
        from before the stream are history's to show, not the stream's, so a second device or a new tab
        sees what it must do to go on — the same event, with the same id, the output queue carried."""
        if info is None or info.closed or info.turn_complete:
            return  # nothing waits (the turn's last commit said so; answered-markers expire, this does not)
        latest: dict[str, Notice] = {}
        for _, notice in live.numbered_notices(0):
            if not isinstance(notice, UnknownNotice) and notice["type"] in WAITING_NOTICE_KINDS:
                latest[str(notice.get("tool_call_id"))] = notice
        if not latest:
            return
        answered = await self.reader.state.filter_answered(thread, list(latest))
        for tool_call_id, notice in latest.items():
            if tool_call_id in answered:
                continue
            if notice["type"] == "input_required":
                kept = await read_question(self.reader.state, thread, tool_call_id)
                if kept is not None and kept.answered_by is not None:
                    continue  # answered: the call is on its way to its result
            yield await self._emit(thread, notice)

    async def _locate(self, message_id: str) -> bool:
        """Find the root row ``message_id`` began its turn with (each root row is searched once); from
        then on the stream starts just before it, past every ``turn_complete`` of earlier turns."""
        info = await self.reader.conversation.get_thread(self.root)
        if info is None or info.tail <= self._scanned:
            return False
        start: int | None = None
        async for row in self.reader.conversation.load_rows(self.root, after=self._scanned, up_to=info.tail):
            self._scanned = row.order
            if row.message_id == message_id:
                start = row.order
                break
        if start is None:
            return False
        usage = 0
        async for record in self.reader.conversation.usage_records(self.root):
            if record.tail is None or record.tail >= start:
                break
            usage = record.version
        # ``version`` stays 0, so the first poll catches up from the start; notices from before the
        # stream are skipped as for any stream.
        self.positions = {self.root: Position(order=start - 1, usage=usage)}
        self._turn_start, self._locating = start, None
        return True

    async def _kept(self, thread: str, info: ThreadInfo | None, notice: Notice | UnknownNotice) -> bool:
        """Whether a ``LIVE`` notice is one a step kept in its usage record (a refusal, an answer given up
        on, a limit stop): one read of the latest records, only when an ``error`` or a limit comes."""
        if isinstance(notice, UnknownNotice) or notice["type"] not in KEPT_NOTICE_KINDS:
            return False
        if info is None:
            return False
        after = max(0, info.version - KEPT_NOTICE_LOOKBACK)
        async for record in self.reader.conversation.usage_records(thread, after_version=after):
            if any(kept["event_id"] == notice["event_id"] for kept in record_notices(thread, record)):
                return True
        return False

    def _in_turn(self, parent: str, child: ThreadInfo) -> bool:
        """Whether a child belongs to what this stream shows: every child, except on a stream of one
        message's turn, where the root's children spawned before that turn are left out."""
        if self._turn_start is None or parent != self.root or child.spawn_order is None:
            return True
        return child.spawn_order >= self._turn_start

    @staticmethod
    def _delta(pos: Position, version: int, live: LiveState) -> str:
        total = live.offset + len(live.text)
        sent = pos.partial_chars if pos.partial_version == version else 0
        if total < sent:
            sent = 0  # the step started its text again (a new completion round)
        pos.partial_version, pos.partial_chars = version, total
        return live.text[max(0, sent - live.offset) :]

    async def _catch_up(
        self, thread: str, info: ThreadInfo, pos: Position
    ) -> AsyncIterator[tuple[str, StreamEvent]]:
        """The rows and ``turn_complete`` events committed up to ``info`` (a consistent snapshot: rows up
        to its tail, records up to its version)."""
        records: list[UsageRecord] = []
        if pos.usage < info.version:
            async for record in self.reader.conversation.usage_records(thread, after_version=pos.usage):
                if record.version > info.version:
                    break
                if record.turn_complete or record.notices is not None:
                    records.append(record)
        if info.tail > pos.order:
            async for row in self.reader.conversation.load_rows(thread, after=pos.order, up_to=info.tail):
                while records and records[0].tail is not None and records[0].tail < row.order:
                    async for streamed in self._record_events(thread, records.pop(0)):
                        yield streamed
                events = row_events(thread, [row])
                skip, pos.row_part = pos.row_part, 0
                for index in range(skip, len(events)):
                    # The token names the event within its row, so a resume never skips the rest of it.
                    last = index == len(events) - 1
                    pos.order, pos.row_part = (row.order, 0) if last else (row.order - 1, index + 1)
                    yield await self._emit(thread, events[index])
                pos.order = row.order
        pos.order = max(pos.order, info.tail)
        while records:
            async for streamed in self._record_events(thread, records.pop(0)):
                yield streamed

    async def _record_events(
        self, thread: str, record: UsageRecord
    ) -> AsyncIterator[tuple[str, StreamEvent]]:
        """A usage record's events (its notices, then its ``turn_complete``), from the part of it a
        resumed stream had already sent."""
        pos = self.positions[thread]
        events = record_events(thread, record)
        for index in range(pos.part, len(events)):
            last = index == len(events) - 1
            pos.part = 0 if last else index + 1
            if last:
                pos.usage = record.version
            made = events[index]
            if made["type"] == "turn_complete" and thread == self.root and self._turn_start is not None:
                self.ended = not self.follow  # the turn this stream was asked for is over
            yield await self._emit(thread, made)
        if not events:
            pos.usage, pos.part = record.version, 0

    async def _emit(self, thread: str, event: OutputEvent | UnknownNotice) -> tuple[str, StreamEvent]:
        if self._metadata is None:
            metadata = await self.reader.state.get_metadata(self.root)
            self._metadata = metadata if metadata is not None else {}
        context: ThreadContext = {
            "thread_id": thread,
            "root_thread_id": self.root,
            "metadata": self._metadata,
        }
        if isinstance(event, UnknownNotice):
            other: OtherNoticeInThread = {**event.fields, **context}
            return self.token(), other
        return self.token(), in_thread(event, context)
