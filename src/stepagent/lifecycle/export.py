"""The export format: its definition, the streaming exporter, and the validating reader imports use.

Format (``FORMAT_VERSION`` 1): one JSON object per line, each with a ``type``::

    header        {"format": "stepagent-export", "version": 1, "root_thread_id": top}
    thread        {"thread_id", "root_id", "parent_id", "spawn_order", "spawn_tool_call_id", "kind",
                   "closed", "rows": n}                                  starts the thread's section
    metadata      {"thread_id": top, "value"}                           the root's metadata (top only)
    subscription  {"thread_id", "tool_call_id"}                         an active subscription
    intent        {"thread_id", "tool_call_id", "tool_name", "arguments", "call_id"}   open outbox intent
    deferred      {"thread_id", "message_id", "message": InputMessage}  a deferred event
    choice        {"thread_id", "choice": UserChoiceRequired}           a pending user choice
    summary       {"thread_id", "up_to_order", "text"}                  a compaction summary
    row           {"thread_id", "order", "message_id", "item": stored item (history_items codec)}
    end           {"threads", "rows"}                                   totals; a file without it is truncated

A section is the thread line, its state lines, its summaries, then its rows in order 1..n. Sections come
parent first (depth first, children in spawn order), like ``stepagent history``. ``top`` is the exported
thread; exporting a child exports its own log (not the prefix it inherits) and its descendants.

Guarantees: one row (or summary, or state entry) is held at a time — a large S3-stored payload is read,
written out as one line and dropped before the next — so memory does not grow with the history's length;
the output is deterministic (same stored tree, same bytes). Processed/answered markers, the call index and
the compaction claim are not exported: they are derived or transient. An export is consistent per thread
(rows are read up to the tail its thread line states), not a snapshot of the whole tree.

Reading (:class:`LineReader`, :class:`Validator`) checks every line of a file without writing anything and
raises :class:`ImportFormatError` — line number and problem — at the first bad one; see
:mod:`stepagent.lifecycle.importer` for the checks and for writing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO, Any

from pydantic import ValidationError

from stepagent.errors import CorruptRowError, InputError, NewerFormatError
from stepagent.formats import FORMAT_VERSION as WRITTEN_VERSION
from stepagent.formats import check_version
from stepagent.history_items import EventItem, ToolCallItem, item_from_dict, item_to_dict
from stepagent.history_items import answered_call_id as answers
from stepagent.messages import InputMessage, ThreadReport, UserChoiceRequired
from stepagent.stores.base import ConversationStore, StateStore, ThreadInfo, ThreadKind

FORMAT = "stepagent-export"
#: The export file's format version: the one version of everything stepagent writes (:mod:`stepagent.formats`).
FORMAT_VERSION = WRITTEN_VERSION
#: The line types allowed between a thread line and its summaries and rows.
STATE_TYPES = ("metadata", "subscription", "intent", "deferred", "choice")
#: The fields of each line type (besides ``type``): exactly these, no more, no fewer.
FIELDS: dict[str, frozenset[str]] = {
    "header": frozenset({"format", "version", "root_thread_id"}),
    "thread": frozenset(
        {"thread_id", "root_id", "parent_id", "spawn_order", "spawn_tool_call_id", "kind", "closed", "rows"}
    ),
    "metadata": frozenset({"thread_id", "value"}),
    "subscription": frozenset({"thread_id", "tool_call_id"}),
    "intent": frozenset({"thread_id", "tool_call_id", "tool_name", "arguments", "call_id"}),
    "deferred": frozenset({"thread_id", "message_id", "message"}),
    "choice": frozenset({"thread_id", "choice"}),
    "summary": frozenset({"thread_id", "up_to_order", "text"}),
    "row": frozenset({"thread_id", "order", "message_id", "item"}),
    "end": frozenset({"threads", "rows"}),
}


class LifecycleError(InputError):
    """An export, import or rewind that cannot be done as asked; the message says why and what to do."""


class ImportFormatError(LifecycleError):
    """An import file line that is not valid; the message names the line number and the problem."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def dumps(record: dict[str, Any]) -> str:
    """One line (without the newline): compact, non-ASCII kept, key order as built."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _line(line_type: str, /, **fields: Any) -> str:
    return dumps({"type": line_type, **fields})


async def export_lines(
    conversation: ConversationStore, state: StateStore, thread_id: str
) -> AsyncIterator[str]:
    """The tree under ``thread_id`` as lines (no trailing newline), one at a time."""
    top = await conversation.get_thread(thread_id)
    if top is None:
        raise LifecycleError(f"no thread {thread_id!r} to export")
    yield _line("header", format=FORMAT, version=FORMAT_VERSION, root_thread_id=thread_id)
    threads = rows = 0
    pending = [top]
    while pending:
        info = pending.pop(0)
        threads += 1
        async for line in _section(conversation, state, info, is_top=info is top):
            yield line
        rows += info.tail
        # Depth first, children in spawn order: only their ids and heads wait here, never their rows.
        pending[0:0] = await conversation.children(info.thread_id)
    yield _line("end", threads=threads, rows=rows)


async def _section(
    conversation: ConversationStore, state: StateStore, info: ThreadInfo, *, is_top: bool
) -> AsyncIterator[str]:
    thread_id = info.thread_id
    yield _line(
        "thread",
        thread_id=thread_id,
        root_id=info.root_id,
        parent_id=info.parent_id,
        spawn_order=info.spawn_order,
        spawn_tool_call_id=info.spawn_tool_call_id,
        kind=info.kind.value,
        closed=info.closed,
        rows=info.tail,
    )
    if is_top and (metadata := await state.get_metadata(info.root_id)) is not None:
        yield _line("metadata", thread_id=thread_id, value=metadata)
    for tool_call_id in sorted(await state.active_subscriptions(thread_id)):
        yield _line("subscription", thread_id=thread_id, tool_call_id=tool_call_id)
    for intent in await state.open_intents(thread_id):
        names = {"tool_call_id": intent.tool_call_id, "tool_name": intent.tool_name}
        yield _line(
            "intent", thread_id=thread_id, **names, arguments=intent.arguments, call_id=intent.call_id
        )
    for deferred in await state.deferred_inputs(thread_id):
        message = deferred.message.model_dump(mode="json")
        yield _line("deferred", thread_id=thread_id, message_id=deferred.message_id, message=message)
    for choice in await state.pending_choices(thread_id):
        yield _line("choice", thread_id=thread_id, choice=choice.model_dump(mode="json"))
    bound: int | None = info.tail
    while bound is not None and (summary := await conversation.latest_summary(thread_id, bound)) is not None:
        yield _line("summary", thread_id=thread_id, up_to_order=summary.up_to_order, text=summary.text)
        bound = summary.up_to_order - 1 if summary.up_to_order > 0 else None
    # Rows are read up to the tail the thread line states, so its count holds even if a step commits.
    count = 0
    async for row in conversation.load_rows(thread_id, up_to=info.tail):
        item = item_to_dict(row.item)
        yield _line("row", thread_id=thread_id, order=row.order, message_id=row.message_id, item=item)
        count = row.order
    if count != info.tail:  # a rewind or replacement cut the thread while it was being read
        raise LifecycleError(f"thread {thread_id} changed while it was exported; export it again")


# ---- reading -----------------------------------------------------------------------------------------------

Line = tuple[int, dict[str, Any]]


class LineReader:
    """An export file's lines as ``(line number, record)``, with one line of lookahead.

    Checks what a single line can show — its size (``max_line_bytes``, the newline not counted), UTF-8,
    JSON, a known ``type`` with exactly its fields — and raises :class:`ImportFormatError` otherwise. Only
    the current line is held."""

    def __init__(self, handle: IO[bytes], max_line_bytes: int) -> None:
        self._handle, self._max, self.number = handle, max_line_bytes, 0
        self._peeked: Line | None = None

    def peek(self) -> Line | None:
        if self._peeked is None:
            self._peeked = self._read()
        return self._peeked

    def next(self) -> Line | None:
        found = self.peek()
        self._peeked = None
        return found

    def _read(self) -> Line | None:
        raw = self._handle.readline(self._max + 2)  # the longest allowed line plus "\r\n"
        if not raw:
            return None
        self.number += 1
        body = raw.rstrip(b"\r\n")
        if len(body) > self._max:
            raise ImportFormatError(self.number, f"the line is longer than the limit of {self._max} bytes")
        try:
            record = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ImportFormatError(self.number, f"not UTF-8: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ImportFormatError(self.number, f"not valid JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ImportFormatError(self.number, "not a JSON object")
        kind = record.get("type")
        if kind not in FIELDS:
            raise ImportFormatError(
                self.number, f"unknown line type {kind!r}; expected one of {sorted(FIELDS)}"
            )
        keys = set(record) - {"type"}
        if keys != FIELDS[kind]:
            missing, unknown = sorted(FIELDS[kind] - keys), sorted(keys - FIELDS[kind])
            raise ImportFormatError(
                self.number, f"{kind} line: missing fields {missing}, unknown fields {unknown}"
            )
        return self.number, record


def text_field(number: int, record: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    """``record[key]`` if it is a non-empty string (or ``None`` when ``optional``), else the line's error."""
    value = record[key]
    if (value is None and optional) or (isinstance(value, str) and value):
        return value
    raise ImportFormatError(number, f"{record['type']} line: {key} must be a non-empty string")


def count_field(number: int, record: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    """``record[key]`` if it is a non-negative integer (or ``None`` when ``optional``), else the error."""
    value = record[key]
    if (value is None and optional) or (type(value) is int and value >= 0):
        return value
    raise ImportFormatError(number, f"{record['type']} line: {key} must be a non-negative integer")


# ---- validation (the import's first pass) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImportLimits:
    """The limits an import file must keep: bytes per line (newline not counted), rows, threads."""

    max_line_bytes: int = 64 * 1024 * 1024
    max_rows: int = 1_000_000
    max_threads: int = 10_000


@dataclass(slots=True)
class _Section:
    """Validation state of the thread whose lines are being read."""

    info: ThreadInfo
    number: int
    phase: int = 0  # 0 state lines, 1 summaries, 2 rows
    next_order: int = 1
    open_calls: set[str] = field(default_factory=set)
    calls: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    summaries: set[int] = field(default_factory=set)
    metadata_seen: bool = False


@dataclass(slots=True)
class Plan:
    """What validation learned: thread records (old ids, file order), calls other threads refer to."""

    top: str = ""
    threads: dict[str, ThreadInfo] = field(default_factory=dict)
    referenced_calls: set[str] = field(default_factory=set)
    rows: int = 0


class Validator:
    """The import's first pass (``Validator(limits).run(lines)``): every line is checked, nothing is
    written. It holds the thread records and the current section's call ids, never rows."""

    def __init__(self, limits: ImportLimits) -> None:
        self.limits = limits
        self.plan = Plan()
        self.section: _Section | None = None
        self.children_named: dict[str, int] = {}  # child ids named by events -> first line naming them
        self.n = 0

    def fail_unless(self, ok: bool, problem: str) -> None:
        if not ok:
            raise ImportFormatError(self.n, problem)

    def run(self, lines: LineReader) -> Plan:
        first = lines.next()
        if first is None:
            raise ImportFormatError(1, "the file is empty")
        self.n, header = first
        self.fail_unless(header["type"] == "header", "the first line must be the header")
        self.fail_unless(header["format"] == FORMAT, f"not a {FORMAT} file (format {header['format']!r})")
        try:
            check_version(header["version"], "this export file")
        except NewerFormatError as exc:
            raise ImportFormatError(self.n, str(exc)) from None
        self.plan.top = str(text_field(self.n, header, "root_thread_id"))
        while (entry := lines.next()) is not None:
            self.n, record = entry
            kind = record["type"]
            self.fail_unless(kind != "header", "a second header line")
            if kind in ("thread", "end"):
                self.close_section()
            if kind == "end":
                self.end(record, lines)
                return self.plan
            if kind == "thread":
                self.section = _Section(self.thread(record), self.n)
                continue
            section = self.section
            self.fail_unless(section is not None, f"a {kind} line before any thread line")
            assert section is not None
            thread_id = section.info.thread_id
            self.fail_unless(record["thread_id"] == thread_id, f"a {kind} line inside thread {thread_id!r}")
            if kind in STATE_TYPES:
                self.fail_unless(section.phase == 0, f"{kind} lines come before summaries and rows")
                self.state_line(record, section)
            elif kind == "summary":
                self.fail_unless(section.phase <= 1, "summary lines come before the thread's rows")
                section.phase = 1
                self.summary(record, section)
            else:
                section.phase = 2
                self.plan.rows += 1
                self.fail_unless(self.plan.rows <= self.limits.max_rows, "more rows than the row limit")
                self.row(record, section)
        raise ImportFormatError(lines.number + 1, "the file ends without an end line (truncated?)")

    def end(self, record: dict[str, Any], lines: LineReader) -> None:
        threads, rows = len(self.plan.threads), self.plan.rows
        self.fail_unless(threads > 0, "the file has no threads")
        self.fail_unless(
            record["threads"] == threads, f"the end line says {record['threads']} threads, not {threads}"
        )
        self.fail_unless(record["rows"] == rows, f"the end line says {record['rows']} rows, not {rows}")
        self.n += 1
        self.fail_unless(lines.next() is None, "nothing may follow the end line")
        for child, where in self.children_named.items():
            self.n = where
            self.fail_unless(
                child in self.plan.threads, f"names child thread {child!r}, which is not in the file"
            )

    def thread(self, record: dict[str, Any]) -> ThreadInfo:
        plan, n = self.plan, self.n
        thread_id = str(text_field(n, record, "thread_id"))
        self.fail_unless(thread_id not in plan.threads, f"thread {thread_id!r} appears twice")
        self.fail_unless(len(plan.threads) < self.limits.max_threads, "more threads than the thread limit")
        self.fail_unless(record["kind"] in set(ThreadKind), f"unknown thread kind {record['kind']!r}")
        self.fail_unless(isinstance(record["closed"], bool), "closed must be true or false")
        info = ThreadInfo(
            thread_id=thread_id,
            root_id=str(text_field(n, record, "root_id")),
            parent_id=text_field(n, record, "parent_id", optional=True),
            spawn_order=count_field(n, record, "spawn_order", optional=True),
            spawn_tool_call_id=text_field(n, record, "spawn_tool_call_id", optional=True),
            kind=ThreadKind(record["kind"]),
            closed=record["closed"],
            tail=int(count_field(n, record, "rows") or 0),
        )
        if not plan.threads:
            self.fail_unless(
                thread_id == plan.top, f"the first thread must be the exported one, {plan.top!r}"
            )
        else:
            parent = plan.threads.get(info.parent_id or "")
            self.fail_unless(
                parent is not None, f"its parent {info.parent_id!r} must come earlier in the file"
            )
            assert parent is not None
            self.fail_unless(
                info.root_id == plan.threads[plan.top].root_id, "its root differs from the top's"
            )
            child_like = info.kind != ThreadKind.ROOT and info.spawn_tool_call_id is not None
            self.fail_unless(child_like, "a child thread needs a child kind and a spawn_tool_call_id")
            order = info.spawn_order
            self.fail_unless(
                order is not None and order <= parent.tail, f"spawn_order {order} is past its parent"
            )
            plan.referenced_calls.add(str(info.spawn_tool_call_id))
        plan.threads[thread_id] = info
        return info

    def close_section(self) -> None:
        if (section := self.section) is not None:
            seen, declared = section.next_order - 1, section.info.tail
            self.fail_unless(
                seen == declared, f"the thread on line {section.number} declares {declared} rows, has {seen}"
            )

    def state_line(self, record: dict[str, Any], section: _Section) -> None:
        kind, n = record["type"], self.n
        try:
            if kind == "metadata":
                self.fail_unless(
                    section.info.thread_id == self.plan.top, "metadata belongs to the top thread"
                )
                self.fail_unless(not section.metadata_seen, "a second metadata line")
                section.metadata_seen = True
            elif kind == "subscription":
                self.plan.referenced_calls.add(str(text_field(n, record, "tool_call_id")))
            elif kind == "intent":
                for key in ("tool_call_id", "tool_name"):
                    text_field(n, record, key)
                text_field(n, record, "call_id", optional=True)
                self.fail_unless(isinstance(record["arguments"], dict), "arguments must be an object")
            elif kind == "deferred":
                text_field(n, record, "message_id")
                synthetic = InputMessage.model_validate(record["message"]).synthetic
                if isinstance(synthetic, ThreadReport):
                    self.children_named.setdefault(synthetic.child_thread_id, n)
            else:
                UserChoiceRequired.model_validate(record["choice"])
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ImportFormatError(n, f"{kind} line: {first['msg']} at {first['loc']}") from None

    def summary(self, record: dict[str, Any], section: _Section) -> None:
        up_to = int(count_field(self.n, record, "up_to_order") or 0)
        self.fail_unless(isinstance(record["text"], str), "summary text must be a string")
        self.fail_unless(
            up_to <= section.info.tail, f"the summary covers order {up_to}, past the thread's rows"
        )
        self.fail_unless(up_to not in section.summaries, f"a second summary for order {up_to}")
        section.summaries.add(up_to)

    def row(self, record: dict[str, Any], section: _Section) -> None:
        order, expected = record["order"], section.next_order
        self.fail_unless(order == expected, f"row order {order!r}, expected {expected} (orders run 1..n)")
        self.fail_unless(order <= section.info.tail, f"row {order} is past the thread's declared rows")
        section.next_order += 1
        text_field(self.n, record, "message_id")
        self.fail_unless(isinstance(record["item"], dict), "the row's item must be an object")
        try:
            item = item_from_dict(record["item"])
        except CorruptRowError as exc:
            raise ImportFormatError(self.n, f"row {order}: {exc}") from None
        if isinstance(item, ToolCallItem):
            call = item.call.id
            self.fail_unless(call not in section.calls, f"row {order}: tool call id {call!r} appears twice")
            section.calls.add(call)
            section.open_calls.add(call)
        elif (answered := answers(item)) is not None and not (
            isinstance(item, EventItem) and item.invocation
        ):
            self.fail_unless(
                answered not in section.answered, f"row {order}: a second result for {answered!r}"
            )
            # A child's first rows may answer the call it inherited from its parent (its spawn call).
            inherited = answered not in section.calls and section.info.parent_id is not None
            known = answered in section.open_calls
            self.fail_unless(
                known or inherited, f"row {order}: result for {answered!r}, which has no open call"
            )
            section.open_calls.discard(answered)
            section.answered.add(answered)
        if isinstance(item, EventItem) and item.child_thread_id is not None:
            self.children_named.setdefault(item.child_thread_id, self.n)
