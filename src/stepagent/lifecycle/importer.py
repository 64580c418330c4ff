"""Import an export file (see :mod:`stepagent.lifecycle.export`): validate everything, then write the tree.

Guarantees:

- **Validate first, all of it.** A first streaming pass checks every line — size, JSON, the format
  version, each record's shape, section order (thread, state, summaries, rows), order continuity 1..n per
  thread, call/result pairing (no duplicate call, no second answer, no answer to an unknown call except a
  child answering a call it inherited), children after their parents, event references to threads of the
  file, and the end line's totals. The first bad line refuses the whole import with
  :class:`~stepagent.lifecycle.export.ImportFormatError` naming the line and the problem; nothing has been
  written then. Limits on line size, rows and threads fail the same way.
- **Never a partial tree.** Each thread's history is staged under a new generation and made visible by one
  conditional head flip; the top thread (the new root) flips last, so until the very last write nothing is
  reachable from it (``get_thread(root)`` is ``None``). If writing fails, the current stagings are
  abandoned; descendants already flipped are unreachable leftovers, and re-running the same import
  overwrites them (their ids derive from the root and the old ids).
- **Ids.** With ``new_root`` the top thread gets that id and every other thread
  ``derived_id("import", new_root, old_id)``; thread records (root, parent), event rows' ``child_thread_id``,
  deferred events' target and reporting child, and the metadata (under the new root) are rewritten
  consistently. Thread ids inside texts and tool-call arguments (e.g. ``spawn_thread(child_of=...)``) are
  NOT rewritten: they are the model's words. Tool call ids and message ids are kept.
- **Restore.** With ``replace=True`` an existing tree is overwritten in place: each thread's history and
  state are replaced (each thread atomically old-or-new, the top last), state missing from the file is
  removed, and threads under it that the file does not list are closed. A failed restore can be re-run.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from stepagent.history_items import EventItem, HistoryItem, Summary, ToolCallItem, item_from_dict
from stepagent.history_items import answered_call_id as answers
from stepagent.ids import derived_id
from stepagent.lifecycle.export import STATE_TYPES, ImportLimits, LifecycleError, LineReader, Plan, Validator
from stepagent.messages import InputMessage, ThreadReport, ToolCall, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    HistoryEntry,
    HistoryStaging,
    Replacement,
    StateCleanup,
    StateStore,
    ThreadInfo,
)

__all__ = ["ImportLimits", "ImportResult", "import_tree"]

#: A flip older than this is considered dead by the sweep that follows a replacement.
SWEEP_LEASE_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What an import did: the root thread written, how many threads and rows, what it replaced or closed."""

    root_thread_id: str
    threads: int
    rows: int
    replaced: int = 0  # threads that existed and were overwritten
    closed: list[str] = field(default_factory=list)  # existing threads the file did not list (restore)


def _open_file(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise LifecycleError(f"cannot read {path}: {exc.strerror or exc}") from None


async def import_tree(
    conversation: ConversationStore,
    state: StateStore,
    path: str | Path,
    *,
    new_root: str | None = None,
    replace_existing: bool = False,
    limits: ImportLimits | None = None,
) -> ImportResult:
    """Validate ``path`` completely, then write its tree (see the module docstring)."""
    limits = limits or ImportLimits()
    with _open_file(Path(path)) as handle:
        plan = Validator(limits).run(LineReader(handle, limits.max_line_bytes))
        handle.seek(0)
        writer = _Writer(conversation, state, plan, new_root, replace_existing)
        await writer.check_targets()
        return await writer.write(LineReader(handle, limits.max_line_bytes))


class _Writer:
    """The second pass: stage every thread, flip each (the top last), then clean up."""

    def __init__(
        self,
        conversation: ConversationStore,
        state: StateStore,
        plan: Plan,
        new_root: str | None,
        restore: bool,
    ) -> None:
        self.conversation, self.state, self.plan, self.restore = conversation, state, plan, restore
        self.top_id = new_root or plan.top
        self.tree_root = self.top_id
        self._new_root = new_root
        self._existing: dict[str, ThreadInfo] = {}

    def map(self, old: str) -> str:
        if old == self.plan.top:
            return self.top_id
        return derived_id("import", self._new_root, old) if self._new_root else old

    async def check_targets(self) -> None:
        """Refuse before writing anything if the targets collide with threads that are not ours."""
        top = await self.conversation.get_thread(self.top_id)
        if top is not None and not self.restore:
            raise LifecycleError(
                f"thread {self.top_id!r} already exists: import with --as NEW_ROOT to make a copy, or with "
                "--replace to restore it from the file"
            )
        if top is not None:
            self.tree_root = top.root_id
            self._existing[self.top_id] = top
        for old in self.plan.threads:
            new = self.map(old)
            found = await self.conversation.get_thread(new) if old != self.plan.top else None
            if found is not None and found.root_id != self.tree_root:
                raise LifecycleError(
                    f"thread {new!r} already exists in another tree (root {found.root_id!r}); import with --as"
                )
            if found is not None:  # ours: a leftover of an interrupted import, or the thread being restored
                self._existing[new] = found

    async def write(self, lines: LineReader) -> ImportResult:
        lines.next()  # the header
        top: tuple[HistoryStaging, Replacement, list[UserChoiceRequired]] | None = None
        current: HistoryStaging | None = None
        try:
            while (entry := lines.next()) is not None and entry[1]["type"] == "thread":
                old = str(entry[1]["thread_id"])
                current, replacement, choices = await self._stage(old, lines)
                if old == self.plan.top:
                    top = (current, replacement, choices)  # flipped last: until then the tree is unreachable
                else:
                    await self._flip(current, replacement, choices)
                current = None
            assert top is not None
            await self._flip(*top)
        except Exception as exc:
            for staging in (current, top[0] if top else None):
                if staging is not None:
                    await staging.abandon()
            exc.add_note(
                f"import into {self.top_id!r} did not complete; run the same import again to finish it"
            )
            raise
        closed = await self._close_unlisted() if self.restore else []
        return ImportResult(self.top_id, len(self.plan.threads), self.plan.rows, len(self._existing), closed)

    async def _stage(
        self, old: str, lines: LineReader
    ) -> tuple[HistoryStaging, Replacement, list[UserChoiceRequired]]:
        new = self.map(old)
        existing = self._existing.get(new)
        # The top always sets the root's metadata, so a restore also clears metadata the file lacks.
        added = _State(metadata=(self.tree_root, None) if old == self.plan.top else None)
        while (entry := lines.peek()) is not None and entry[1]["type"] in STATE_TYPES:
            lines.next()
            added.take(entry[1], self.map(old), self.map, self.tree_root)
        staging = await self.conversation.stage_history(new, existing.version if existing else 0)
        open_calls: dict[str, None] = {}
        await staging.add(self._entries(lines, added.indexed, open_calls))
        record = self._record(old) if not (old == self.plan.top and existing) else None
        commit = added.commit()
        cleanup = await self._cleanup(new, commit, added.choices, open_calls) if existing else StateCleanup()
        return staging, Replacement(record=record, state=commit, cleanup=cleanup), added.choices

    async def _entries(
        self, lines: LineReader, indexed: list[ToolCall], open_calls: dict[str, None]
    ) -> AsyncIterator[HistoryEntry]:
        while (entry := lines.peek()) is not None and entry[1]["type"] in ("summary", "row"):
            record = entry[1]
            lines.next()
            if record["type"] == "summary":
                yield Summary(text=record["text"], up_to_order=record["up_to_order"])
                continue
            item: HistoryItem = item_from_dict(record["item"])
            if isinstance(item, ToolCallItem):
                open_calls[item.call.id] = None
                if item.call.id in self.plan.referenced_calls:
                    indexed.append(item.call)  # children and subscriptions refer to it: keep it findable
            elif (answered := answers(item)) is not None:
                open_calls.pop(answered, None)
            if isinstance(item, EventItem) and item.child_thread_id is not None:
                item = replace(item, child_thread_id=self.map(item.child_thread_id))
            yield item, str(record["message_id"])

    def _record(self, old: str) -> ThreadInfo:
        info = self.plan.threads[old]
        if old == self.plan.top:
            return ThreadInfo(thread_id=self.top_id, root_id=self.top_id)
        parent = self.map(info.parent_id or "")
        return replace(info, thread_id=self.map(old), root_id=self.tree_root, parent_id=parent, tail=0)

    async def _cleanup(
        self, thread_id: str, added: Commit, choices: list[UserChoiceRequired], open_calls: dict[str, None]
    ) -> StateCleanup:
        """What an existing thread holds that the file does not: removed with the flip."""
        state = self.state
        intents = {i.tool_call_id for i in added.intents_added}
        deferred = {d.message_id for d in added.deferred_added}
        kept_choices = {choice.id for choice in choices}
        old_intents = [i.tool_call_id for i in await state.open_intents(thread_id)]
        old_deferred = [d.message_id for d in await state.deferred_inputs(thread_id)]
        old_choices = [c.id for c in await state.pending_choices(thread_id)]
        return StateCleanup(
            intents=[i for i in old_intents if i not in intents],
            subscriptions=sorted(
                await state.active_subscriptions(thread_id) - set(added.subscriptions_added)
            ),
            deferred=[d for d in old_deferred if d not in deferred],
            choices=[c for c in old_choices if c not in kept_choices],
            # A call the new history leaves open (or an open intent's call) must not look answered.
            answered=sorted({*open_calls, *intents}),
        )

    async def _flip(
        self, staging: HistoryStaging, replacement: Replacement, choices: list[UserChoiceRequired]
    ) -> None:
        await staging.flip(replacement)
        for choice in choices:
            await self.state.add_pending_choice(staging.thread_id, choice)
        if staging.thread_id in self._existing:  # the old generation is garbage now
            await self.conversation.sweep_generations(
                staging.thread_id, now=time.time(), lease_seconds=SWEEP_LEASE_SECONDS
            )

    async def _close_unlisted(self) -> list[str]:
        listed = {self.map(old) for old in self.plan.threads}
        closed: list[str] = []
        pending = [self.top_id]
        while pending:
            for child in await self.conversation.children(pending.pop()):
                pending.append(child.thread_id)
                if child.thread_id not in listed and not child.closed:
                    await self.conversation.close_thread(child.thread_id)
                    closed.append(child.thread_id)
        return closed


@dataclass(slots=True)
class _State:
    """A thread's state lines, rewritten to the new ids, as the commit its flip applies."""

    metadata: tuple[str, Any] | None
    intents: list[DispatchIntent] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)
    deferred: list[DeferredInput] = field(default_factory=list)
    choices: list[UserChoiceRequired] = field(default_factory=list)
    indexed: list[ToolCall] = field(default_factory=list)

    def take(self, record: dict[str, Any], thread_id: str, map_id: Callable[[str], str], root: str) -> None:
        kind = record["type"]
        if kind == "metadata":
            self.metadata = (root, record["value"])
        elif kind == "subscription":
            self.subscriptions.append(record["tool_call_id"])
        elif kind == "intent":
            fields = {k: record[k] for k in ("tool_call_id", "tool_name", "arguments", "call_id")}
            self.intents.append(DispatchIntent(**fields))
        elif kind == "deferred":
            message = InputMessage.model_validate(record["message"])
            update: dict[str, Any] = {"group_id": thread_id}
            if isinstance(message.synthetic, ThreadReport):
                child = map_id(message.synthetic.child_thread_id)
                update["synthetic"] = message.synthetic.model_copy(update={"child_thread_id": child})
            self.deferred.append(DeferredInput(record["message_id"], message.model_copy(update=update)))
        elif kind == "choice":
            self.choices.append(UserChoiceRequired.model_validate(record["choice"]))

    def commit(self) -> Commit:
        return Commit(
            expected_version=0,
            intents_added=self.intents,
            subscriptions_added=self.subscriptions,
            deferred_added=self.deferred,
            indexed_calls=self.indexed,
            metadata=self.metadata,
        )
