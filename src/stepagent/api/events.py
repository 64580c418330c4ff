"""A thread tree's output events, read from the stores, with a resume token after each one.

**Where the events come from.** Not from the output queue: it is one shared FIFO that a single consumer
drains, so it cannot serve many browsers, nor replay what a dropped connection missed. The committed events
are derived from what the worker committed, with the very ids the output queue carries:

- ``text``, ``tool_call``, ``tool_result``, ``event`` — one per stored history row
  (:func:`stepagent.aws.outputs.row_events`), in the thread's row order;
- ``turn_complete`` — one per usage record that says the turn was complete, placed right after the last row
  of its commit (the record keeps the thread's tail at that commit);
- ``error``, ``oauth_required``, ``limit_reached`` and any other notice — from the thread's ``LIVE``
  item's notices, when they are recorded (only those recorded after the stream began, as for any
  watcher); a notice of a kind this version does not read is forwarded as stored
  (:class:`OtherNoticeInThread`);
- ``text_delta`` (not an output-queue event) — the part of the ``LIVE`` item's partial text not sent yet,
  only while the head is still at the version that text follows (a commit makes it a ``text`` event).

Each carries the thread context after its own keys (:func:`stepagent.aws.output_events.in_thread`;
``text_delta`` has ``thread_id`` and ``root_thread_id`` but no ``event_id`` and no ``metadata``):
:data:`StreamEvent` is their union.

**The resume token** (the SSE ``id:``) is the stream's position after the event: per thread of the tree,
the last row order sent, the head version and the last ``turn_complete`` version fully sent, the notices
seen, and the partial text's (version, characters sent). Everything it names is stored durably, so a new
stream given the token (``Last-Event-ID`` or ``?after=``), on any process, yields exactly the events after
it: none lost, none repeated. Per thread the order is the commit order; threads of a tree interleave as
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
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from typing_extensions import TypedDict

from stepagent.aws.output_events import OutputEvent, OutputEventInThread, ThreadContext, in_thread
from stepagent.aws.outputs import row_events, turn_complete_event
from stepagent.client.watch import StoreReader
from stepagent.notices import OtherNotice, UnknownNotice
from stepagent.providers.base import Usage
from stepagent.stores.base import ThreadInfo, UsageRecord
from stepagent.stores.dynamodb_layout import info_from_item
from stepagent.stores.dynamodb_live import LiveState, decode_live

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


class TextDelta(TypedDict):
    """The part of a thread's reply being written that the stream has not sent yet."""

    type: Literal["text_delta"]
    thread_id: str
    root_thread_id: str
    text: str


class OtherNoticeInThread(OtherNotice, ThreadContext):
    """A notice of a kind this version does not read, as stored, with the thread context."""


StreamEvent = OutputEventInThread | OtherNoticeInThread | TextDelta
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

    def as_list(self) -> list[int | None]:
        return [self.order, self.version, self.usage, self.notices, self.partial_version, self.partial_chars]


def encode_token(positions: dict[str, Position]) -> str:
    """The resume token of ``positions`` (opaque to clients)."""
    raw = json.dumps({t: p.as_list() for t, p in positions.items()}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, root: str) -> dict[str, Position]:
    """The positions a token holds; :class:`BadToken` when it is not one of ours or not of ``root``."""
    if len(token) > MAX_TOKEN_CHARS:
        raise BadToken("the resume token is too long")
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        positions = {}
        for thread, values in data.items():
            order, version, usage, notices, pv, pc = values
            for number in (order, version, usage, pv, pc):
                if not isinstance(number, int) or isinstance(number, bool):
                    raise TypeError
            if notices is not None and not isinstance(notices, int):
                raise TypeError
            positions[str(thread)] = Position(order, version, usage, notices, pv, pc)
    except (ValueError, TypeError, AttributeError, binascii.Error) as error:
        raise BadToken("the resume token (Last-Event-ID or after) is not one this stream sent") from error
    if root not in positions:
        raise BadToken("the resume token belongs to another thread")
    return positions


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
    """Follows the thread tree of ``root`` from ``positions`` (empty: from the start); :meth:`events`
    yields ``(resume token, event)``."""

    def __init__(
        self,
        reads: SharedReads,
        root: str,
        positions: dict[str, Position] | None = None,
        *,
        follow: bool = False,
    ) -> None:
        self.reads = reads
        self.reader = reads.reader
        self.root = root
        self.positions: dict[str, Position] = positions if positions else {root: Position()}
        self.follow = follow
        self.ended = False
        self.busy = True
        self._metadata: Any = None
        self._fast_until = time.monotonic() + BUSY_GRACE
        self._polled_at = time.monotonic()

    def token(self) -> str:
        return encode_token(self.positions)

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
                if child.thread_id not in self.positions:
                    self.positions[child.thread_id] = Position(notices=0)
            pos.version = info.version
        live = view.live
        if pos.notices is None:
            pos.notices = live.notice_seq
        else:
            for number, notice in live.numbered_notices(pos.notices):
                pos.notices = number  # the resume token names this notice, whatever was skipped before it
                yield await self._emit(thread, notice)
            pos.notices = max(pos.notices, live.notice_seq)
        version = info.version if info is not None else 0
        if live.phase is not None and live.version == version and live.text:
            delta = self._delta(pos, version, live)
            if delta:
                delta_event: TextDelta = {
                    "type": "text_delta",
                    "thread_id": thread,
                    "root_thread_id": self.root,
                    "text": delta,
                }
                yield self.token(), delta_event

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
                if record.turn_complete:
                    records.append(record)
        if info.tail > pos.order:
            async for row in self.reader.conversation.load_rows(thread, after=pos.order, up_to=info.tail):
                while records and records[0].tail is not None and records[0].tail < row.order:
                    yield await self._turn_complete(thread, records.pop(0))
                events = row_events(thread, [row])
                pos.order = row.order
                for event in events:
                    yield await self._emit(thread, event)
        pos.order = max(pos.order, info.tail)
        while records:
            yield await self._turn_complete(thread, records.pop(0))

    async def _turn_complete(self, thread: str, record: UsageRecord) -> tuple[str, StreamEvent]:
        self.positions[thread].usage = record.version
        usage = Usage(input_tokens=record.input_tokens, output_tokens=record.output_tokens)
        return await self._emit(thread, turn_complete_event(thread, record.version, usage, record.model))

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
