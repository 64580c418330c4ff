"""The DynamoDB item layout of the conversation table: keys and the head-item codec (pure, no I/O).

What it guarantees: one definition of every conversation-table key and of the head item's encoding, shared
by the store (:mod:`~stepagent.stores.dynamodb.conversation`) and its replacement primitives
(:mod:`~stepagent.stores.dynamodb.replace`), so the two can never disagree about where a row, a summary
or a head lives. Numbers are zero-padded so ``sk`` sorts numerically; :func:`row_sk` and
:func:`row_generation` are inverses.

Item layout (``pk`` = thread id in both tables)::

    conversation  HEAD              root_id kind closed version tail [epoch] [parent_id spawn_order spawn_tool_call_id]
                                    [gen] [pending_gen pending_at]       generation pointer, replacement mark
                                    [mc]                                 model calls since the last user text
                                    [turn_complete] [inbox]              last commit's turn flag; ids of
                                                                         messages sent here by other threads,
                                                                         not yet processed (string set)
                                    [journal journal_n]                  a flipped commit's pending journal
                                    [created_at]                         epoch milliseconds of the first commit
                                                                         (absent on heads written before it)
                                    [rel] [cfg] [cfg0] [committed_at]    the stepagent release, the agent
                                                                         configuration's fingerprint and the
                                                                         time of the last commit; cfg0 the
                                                                         first fingerprint recorded
                                    [fl] [oi] [dq] [ch]                  state flags: with ``fl`` = 1 the
                                                                         string sets ``oi`` (open intents),
                                                                         ``dq`` (deferred inputs), ``ch``
                                                                         (pending choices) are exact, an
                                                                         absent set meaning none; without
                                                                         ``fl`` nothing is known (ask)
                                    [sum] [sv]                           order the latest summary covers
                                                                         (-1: none; absent: unknown, query
                                                                         ``S#``) and the token of its copy
                  R#{order:012d}    message_id cv [ep] (body | blob)       one history row, encoded item JSON
                  R#g{gen}#{order:012d}  (same)                          a row of a replaced history
                  S#{up_to:012d}    (body | blob) [cid]                  compaction summary text; ``cid``
                                                                         the filter of the call ids it hides
                                                                         (absent: unknown)
                  SUMMARY           up_to sv (body | blob) [cid]         copy of the latest summary, valid
                                                                         only while the head's ``sv`` matches
                  C#{child_id}      seq                                  child index entry (spawn order)
                  U#{version:012d}  step_id model in out cr cw calls done [cost] [output] [rel]
                                                                         model usage of the commit
                                                                          that produced head ``version``
    state         P#{message_id}    expires_at                           processed marker (TTL)
                  A#{tool_call_id}  expires_at                           answered marker (TTL)
                  META              [body | blob] [sp_tokens sp_pusd]    metadata JSON, under the root's id,
                                                                         and the conversation's spend (tokens,
                                                                         picodollars; ADDed
                                                                         by every commit with a usage record)
                  SUB#{tool_call_id}                                     active subscription
                  CHOICE#{id}       (body | blob) seq                    UserChoiceRequired JSON
                  I#{tool_call_id}  (body | blob) seq                    DispatchIntent JSON (outbox)
                  D#{message_id}    (body | blob) seq                    DeferredInput JSON
                  CALL#{tool_call_id} (body | blob)                      indexed ToolCall JSON (spawn/subscribe)
                  COMPACTION        claim_id lease_expires               compaction in progress
                  FLAGS_UNKNOWN                                          state was added before the thread
                                                                         had a head: its flags are not exact
                  LIVE              version [text phase tool] [notices notice_seq] expires_at
                                                                         what a step is doing now, for clients
                  J#{token}#{n:06d} (body | blob) expires_at             journal entry: one chunk of actions

The state-table items are written by :mod:`~stepagent.stores.dynamodb.state`, except ``LIVE``
(:mod:`~stepagent.stores.dynamodb.live`); ``J#`` entries by :mod:`~stepagent.stores.dynamodb.journal`. ``inbox`` is added to by
:meth:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore.note_inbound` before a step sends another thread
a message, and its processed ids are deleted by the commit that records them, so a non-empty ``inbox``
means a message is on its way to (or waiting in) that thread.

The state flags and the summary pointer let a step read a thread in one ``BatchGetItem`` (head, the
``SUMMARY`` copy, ``META`` and the batch's markers) and one ``Query`` of the rows after the summary,
without querying state that is almost always empty. Who keeps them exact: a commit's head update (``oi``
gains its intents, ``dq`` is recomputed from the head it was conditioned on), ``mark_intent_done`` and
``add/remove_pending_choice`` (one transaction with the item they change), ``save_summary`` (``S#``, the
copy and ``sum``/``sv`` in one transaction). Rewinds and replacements drop ``fl`` and ``sv`` (their
cleanup changes state the sets do not track) and set ``sum``; heads written before these attributes
existed have neither and are read the old way.

``cid`` is :meth:`~stepagent.call_id_filter.CallIdFilter.encode` (1,025 bytes) of ``Summary.call_ids`` in
base64 (a 1,368-character string), on the ``S#`` item and its ``SUMMARY`` copy alike, so the cold load's
``BatchGetItem`` reads it with the summary at no extra request. A string, not a binary attribute: every
write is JSON-encoded somewhere on its way (the transaction's idempotency token, journal entries that a
later build may replay), and JSON has no bytes. A summary without it (written before it existed, or
imported) reads as ``call_ids=None``.

``(body | blob)`` is a payload (:meth:`~stepagent.stores.dynamodb.io.DynamoIo.payload`): inline ``body``;
or, for a big JSON payload, its skeleton in ``body`` plus ``texts`` naming the content-addressed
``blobs/sha256/<hex>`` objects of its large strings (shared, never deleted); or a per-item S3 object named
by ``blob`` (deleted with its row).
"""

from __future__ import annotations

import base64
import binascii

from stepagent.call_id_filter import CallIdFilter
from stepagent.formats import item_version, running_release
from stepagent.history_items import Summary
from stepagent.stores.base import Commit, ThreadInfo, ThreadKind, UsageRecord
from stepagent.stores.dynamodb.io import DynamoItem, Write, item_key, n_attr, s_attr, update

__all__ = [
    "CALL_IDS_ATTRIBUTE",
    "CHILD_PREFIX",
    "CHOICES_ATTRIBUTE",
    "CONFIG_ATTRIBUTE",
    "CREATED_AT_ATTRIBUTE",
    "DEFERRED_ATTRIBUTE",
    "FLAGS_ATTRIBUTE",
    "HEAD_SK",
    "INBOX_ATTRIBUTE",
    "INTENTS_ATTRIBUTE",
    "LATEST_SUMMARY_SK",
    "RELEASE_ATTRIBUTE",
    "START_CONFIG_ATTRIBUTE",
    "SUMMARY_ORDER_ATTRIBUTE",
    "SUMMARY_TOKEN_ATTRIBUTE",
    "TURN_COMPLETE_ATTRIBUTE",
    "deferred_after",
    "head_after",
    "head_generation",
    "head_inbox",
    "head_item",
    "head_set",
    "head_update",
    "info_from_item",
    "row_generation",
    "row_sk",
    "summary_call_ids",
    "summary_call_ids_attribute",
    "summary_sk",
    "usage_from_item",
    "usage_item",
    "usage_sk",
]

HEAD_SK = "HEAD"
CHILD_PREFIX = "C#"
USAGE_PREFIX = "U#"
TURN_COMPLETE_ATTRIBUTE = "turn_complete"
TURN_MODEL_CALLS_ATTRIBUTE = "mc"
#: The pace hints on a thread's head (:attr:`ThreadInfo.turn_ended_at`, :attr:`ThreadInfo.person_gap`).
TURN_ENDED_AT_ATTRIBUTE = "te"
PERSON_GAP_ATTRIBUTE = "pg"
#: The provider's tokens per estimated token (:attr:`ThreadInfo.estimate_scale`).
ESTIMATE_SCALE_ATTRIBUTE = "es"
INBOX_ATTRIBUTE = "inbox"
CREATED_AT_ATTRIBUTE = "created_at"
FLAGS_ATTRIBUTE = "fl"
INTENTS_ATTRIBUTE = "oi"
DEFERRED_ATTRIBUTE = "dq"
CHOICES_ATTRIBUTE = "ch"
SUMMARY_ORDER_ATTRIBUTE = "sum"
SUMMARY_TOKEN_ATTRIBUTE = "sv"
LATEST_SUMMARY_SK = "SUMMARY"
CALL_IDS_ATTRIBUTE = "cid"
#: The stepagent release whose commit moved the head last (and that stored a ``U#`` usage record).
RELEASE_ATTRIBUTE = "rel"
#: The agent configuration's fingerprint of the head's last commit, and of the first commit that had one.
CONFIG_ATTRIBUTE = "cfg"
START_CONFIG_ATTRIBUTE = "cfg0"
#: Epoch milliseconds of the head's last commit.
COMMITTED_AT_ATTRIBUTE = "committed_at"


def row_sk(order: int, generation: str = "") -> str:
    """The sort key of row ``order`` of ``generation``."""
    # Generation "" is the original layout; a replaced history lives under its own generation's prefix,
    # which sorts after every digit, so an ``R#{order}`` range Query never reaches another generation.
    return f"R#g{generation}#{order:012d}" if generation else f"R#{order:012d}"


def row_generation(sk: str) -> str:
    """The generation of a row's sort key (the inverse of :func:`row_sk`)."""
    parts = sk.split("#")
    return parts[1][1:] if len(parts) == 3 else ""


def head_generation(head: DynamoItem) -> str:
    """The generation a head points at ("" for a history that was never replaced)."""
    return str(head["gen"]["S"]) if "gen" in head else ""


def head_inbox(head: DynamoItem) -> frozenset[str]:
    """The logical ids of messages other threads sent this thread that it has not processed yet."""
    return frozenset(str(value) for value in head.get(INBOX_ATTRIBUTE, {}).get("SS", []))


def head_set(head: DynamoItem, attribute: str) -> set[str]:
    """A string-set attribute of the head (empty when absent)."""
    return {str(value) for value in head.get(attribute, {}).get("SS", [])}


def summary_sk(up_to: int) -> str:
    """The sort key of the compaction summary covering orders up to ``up_to``."""
    return f"S#{up_to:012d}"


def summary_call_ids_attribute(summary: Summary) -> DynamoItem:
    """The ``cid`` attribute a summary item carries (none when its filter is unknown)."""
    if summary.call_ids is None:
        return {}
    return {CALL_IDS_ATTRIBUTE: s_attr(base64.b64encode(summary.call_ids.encode()).decode("ascii"))}


def summary_call_ids(item: DynamoItem) -> CallIdFilter | None:
    """The call-id filter of an ``S#`` or ``SUMMARY`` item (``None``: absent, unreadable, or of a format
    this build does not know — all of which mean unknown, never "no calls hidden")."""
    value = item.get(CALL_IDS_ATTRIBUTE, {}).get("S")
    if not isinstance(value, str):
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    return CallIdFilter.decode(data)


def info_from_item(item: DynamoItem) -> ThreadInfo:
    """The thread record and head encoded in a ``HEAD`` item."""

    def text(name: str) -> str | None:
        return str(item[name]["S"]) if name in item else None

    def number(name: str) -> int | None:
        return int(item[name]["N"]) if name in item else None

    thread_id = str(item["pk"]["S"])
    item_version(item, f"the head of thread {thread_id}")
    turn = item.get(TURN_COMPLETE_ATTRIBUTE, {}).get("BOOL")
    return ThreadInfo(
        thread_id=thread_id,
        root_id=text("root_id") or thread_id,
        parent_id=text("parent_id"),
        spawn_order=number("spawn_order"),
        spawn_tool_call_id=text("spawn_tool_call_id"),
        kind=ThreadKind(text("kind") or ThreadKind.ROOT),
        closed=bool(item.get("closed", {}).get("BOOL", False)),
        version=number("version") or 0,
        tail=number("tail") or 0,
        epoch=number("epoch") or 0,
        turn_complete=bool(turn) if turn is not None else None,
        turn_model_calls=number(TURN_MODEL_CALLS_ATTRIBUTE) or 0,
        turn_ended_at=seconds(item, TURN_ENDED_AT_ATTRIBUTE),
        person_gap=seconds(item, PERSON_GAP_ATTRIBUTE),
        estimate_scale=seconds(item, ESTIMATE_SCALE_ATTRIBUTE),
    )


def seconds(item: DynamoItem, name: str) -> float | None:
    """A numeric hint of a head item (seconds, a scale), ``None`` when it is not there."""
    return float(item[name]["N"]) if name in item else None


def pace_values(commit: Commit) -> dict[str, str]:
    """The hints ``commit`` records on the head: attribute name -> number (seconds to the millisecond, or
    the estimate's scale)."""
    out = {}
    if commit.turn_ended_at is not None:
        out[TURN_ENDED_AT_ATTRIBUTE] = f"{commit.turn_ended_at:.3f}"
    if commit.person_gap is not None:
        out[PERSON_GAP_ATTRIBUTE] = f"{commit.person_gap:.3f}"
    if commit.estimate_scale is not None:
        out[ESTIMATE_SCALE_ATTRIBUTE] = f"{commit.estimate_scale:.4f}"
    return out


def head_item(info: ThreadInfo, *, fresh: bool = False) -> DynamoItem:
    """The ``HEAD`` item of ``info`` (optional fields are omitted when unset; no generation). ``fresh``:
    a thread created with no state at all, so its state flags are exact from the start (empty sets, no
    summary)."""
    item: DynamoItem = {
        **item_key(info.thread_id, HEAD_SK),
        "root_id": s_attr(info.root_id),
        "kind": s_attr(info.kind.value),
        "closed": {"BOOL": info.closed},
        "version": n_attr(info.version),
        "tail": n_attr(info.tail),
    }
    if info.parent_id is not None:
        item["parent_id"] = s_attr(info.parent_id)
    if info.spawn_order is not None:
        item["spawn_order"] = n_attr(info.spawn_order)
    if info.spawn_tool_call_id is not None:
        item["spawn_tool_call_id"] = s_attr(info.spawn_tool_call_id)
    if info.epoch:
        item["epoch"] = n_attr(info.epoch)
    if info.turn_complete is not None:
        item[TURN_COMPLETE_ATTRIBUTE] = {"BOOL": info.turn_complete}
    if fresh:
        item[FLAGS_ATTRIBUTE] = n_attr(1)
        item[SUMMARY_ORDER_ATTRIBUTE] = n_attr(-1)
    return item


def usage_sk(version: int) -> str:
    """The sort key of the usage record stored by the commit that produced head ``version``."""
    return f"{USAGE_PREFIX}{version:012d}"


_USAGE_COUNTS = (
    ("in", "input_tokens"),
    ("out", "output_tokens"),
    ("cr", "cache_read_tokens"),
    ("cw", "cache_write_tokens"),
    ("calls", "completions"),
)


def usage_item(thread_id: str, record: UsageRecord, version: int, tail: int | None = None) -> DynamoItem:
    """The ``U#`` item of ``record``, stored by the commit that produces head ``version`` (and ``tail``)."""
    item: DynamoItem = {
        **item_key(thread_id, usage_sk(version)),
        "step_id": s_attr(record.step_id),
        "model": s_attr(record.model),
        "done": {"BOOL": record.turn_complete},
        RELEASE_ATTRIBUTE: s_attr(running_release()),
    }
    for attribute, name in _USAGE_COUNTS:
        item[attribute] = n_attr(int(getattr(record, name)))
    if record.cost_usd is not None:
        item["cost"] = {"N": f"{record.cost_usd:.10f}".rstrip("0").rstrip(".") or "0"}  # never 1e-07
    if record.output is not None:
        item["output"] = s_attr(record.output)
    if record.notices is not None:
        item["notices"] = s_attr(record.notices)
    if tail is not None:
        item["tail"] = n_attr(tail)
    return item


def usage_from_item(item: DynamoItem) -> UsageRecord:
    """The :class:`UsageRecord` a ``U#`` item holds (its ``version`` from the sort key)."""
    counts = {name: int(item[attribute]["N"]) for attribute, name in _USAGE_COUNTS if attribute in item}
    return UsageRecord(
        step_id=str(item["step_id"]["S"]),
        model=str(item["model"]["S"]),
        turn_complete=bool(item.get("done", {}).get("BOOL", False)),
        version=int(str(item["sk"]["S"])[len(USAGE_PREFIX) :]),
        cost_usd=float(item["cost"]["N"]) if "cost" in item else None,
        output=str(item["output"]["S"]) if "output" in item else None,
        notices=str(item["notices"]["S"]) if "notices" in item else None,
        tail=int(item["tail"]["N"]) if "tail" in item else None,
        **counts,
    )


# ---- the commit's head update (pure: the store runs it) ----------------------------------------------


def head_update(
    table: str,
    info: ThreadInfo,
    new_tail: int,
    commit: Commit | None = None,
    deferred: set[str] | None = None,
    *,
    now_ms: int,
    config: str | None = None,
) -> Write:
    """Move the head from ``info.version`` to ``info.version + 1`` and ``new_tail``, only if it is still at
    ``info.version``. At version 0 this creates the root record (``created_at`` = ``now_ms``, epoch
    milliseconds), keeping one a spawn already made. A
    ``commit`` also sets the turn flag, takes the ids it processed out of the ``inbox``, adds its
    intents to the open-intent set and sets the deferred set to ``deferred`` (``None``: unchanged). Every
    update records the running release (``rel``) and, given one, the agent ``config`` fingerprint (``cfg``;
    ``cfg0`` keeps the first one the thread recorded)."""
    names = {"#v": "version", "#t": "tail", "#rel": RELEASE_ATTRIBUTE, "#cat": COMMITTED_AT_ATTRIBUTE}
    values: DynamoItem = {
        ":nv": n_attr(info.version + 1),
        ":nt": n_attr(new_tail),
        ":e": n_attr(info.version),
        ":rel": s_attr(running_release()),
        ":cat": n_attr(now_ms),
    }
    sets = ["#v = :nv", "#t = :nt", "#rel = :rel", "#cat = :cat"]
    if config is not None:
        names.update({"#cfg": CONFIG_ATTRIBUTE, "#cfg0": START_CONFIG_ATTRIBUTE})
        values[":cfg"] = s_attr(config)
        sets += ["#cfg = :cfg", "#cfg0 = if_not_exists(#cfg0, :cfg)"]
    removes: list[str] = []
    adds: list[str] = []
    deletes: list[str] = []
    condition = "#v = :e"
    if commit is not None:
        names["#tc"] = TURN_COMPLETE_ATTRIBUTE
        values[":tc"] = {"BOOL": commit.turn_complete}
        sets.append("#tc = :tc")
        if commit.turn_model_calls is not None:
            names["#mc"] = TURN_MODEL_CALLS_ATTRIBUTE
            values[":mc"] = n_attr(commit.turn_model_calls)
            sets.append("#mc = :mc")
        for n, (attribute, number) in enumerate(pace_values(commit).items()):
            names[f"#pace{n}"] = attribute
            values[f":pace{n}"] = {"N": number}
            sets.append(f"#pace{n} = :pace{n}")
        processed = sorted(set(commit.processed_message_ids))
        if processed:
            names["#in"] = INBOX_ATTRIBUTE
            values[":in"] = {"SS": processed}
            deletes.append("#in :in")
        intents = sorted({intent.tool_call_id for intent in commit.intents_added})
        if intents:
            names["#oi"] = INTENTS_ATTRIBUTE
            values[":oi"] = {"SS": intents}
            adds.append("#oi :oi")
        if deferred is not None:
            names["#dq"] = DEFERRED_ATTRIBUTE
            if deferred:
                values[":dq"] = {"SS": sorted(deferred)}
                sets.append("#dq = :dq")
            else:
                removes.append("#dq")
    if info.version == 0:
        names.update(
            {
                "#pk": "pk",
                "#r": "root_id",
                "#k": "kind",
                "#c": "closed",
                "#fl": FLAGS_ATTRIBUTE,
                "#sum": SUMMARY_ORDER_ATTRIBUTE,
                "#ca": CREATED_AT_ATTRIBUTE,
            }
        )
        values.update(
            {
                ":r": s_attr(info.thread_id),
                ":k": s_attr(ThreadKind.ROOT.value),
                ":f": {"BOOL": False},
                ":one": n_attr(1),
                ":none": n_attr(-1),
                ":ca": n_attr(now_ms),
            }
        )
        # A thread's first commit finds no state (nothing is stored before it), so its flags are exact.
        sets += [
            "#r = if_not_exists(#r, :r)",
            "#k = if_not_exists(#k, :k)",
            "#c = if_not_exists(#c, :f)",
            "#fl = if_not_exists(#fl, :one)",
            "#sum = if_not_exists(#sum, :none)",
            "#ca = if_not_exists(#ca, :ca)",  # when the thread's first commit landed (the console's list)
        ]
        condition = "attribute_not_exists(#pk) OR #v = :e"
    expression = "SET " + ", ".join(sets)
    for clause, parts in (("REMOVE", removes), ("ADD", adds), ("DELETE", deletes)):
        if parts:
            expression += f" {clause} " + ", ".join(parts)
    return update(
        table,
        item_key(info.thread_id, HEAD_SK),
        expression,
        names,
        values,
        ConditionExpression=condition,
    )


def deferred_after(head: DynamoItem | None, commit: Commit) -> set[str] | None:
    """The deferred-input set after ``commit`` (``None``: the commit does not change it). Exact because the
    commit is conditioned on the version of ``head``, and only versioned writes change deferrals."""
    if not commit.deferred_added and not commit.deferred_removed:
        return None
    current = head_set(head, DEFERRED_ATTRIBUTE) if head else set()
    removed = set(commit.deferred_removed)
    return (current | {d.message_id for d in commit.deferred_added}) - removed


def head_after(head: DynamoItem, new: ThreadInfo, commit: Commit, deferred: set[str] | None) -> DynamoItem:
    """The head item ``commit`` left (as far as a later commit reads it: version, tail, epoch, generation,
    deferred set; the inbox and intent sets for completeness)."""
    after = {k: v for k, v in head.items() if k not in ("journal", "journal_n")}  # journal.py's
    after["version"] = n_attr(new.version)
    after["tail"] = n_attr(new.tail)
    after[TURN_COMPLETE_ATTRIBUTE] = {"BOOL": commit.turn_complete}
    if commit.turn_model_calls is not None:
        after[TURN_MODEL_CALLS_ATTRIBUTE] = n_attr(commit.turn_model_calls)
    for attribute, number in pace_values(commit).items():
        after[attribute] = {"N": number}
    inbox = head_inbox(head) - set(commit.processed_message_ids)
    sets = {
        INBOX_ATTRIBUTE: inbox,
        INTENTS_ATTRIBUTE: head_set(head, INTENTS_ATTRIBUTE) | {i.tool_call_id for i in commit.intents_added},
    }
    if deferred is not None:
        sets[DEFERRED_ATTRIBUTE] = deferred
    for name, values in sets.items():
        if values:
            after[name] = {"SS": sorted(values)}
        else:
            after.pop(name, None)
    return after
