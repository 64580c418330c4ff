"""``stepagent configs``: which threads last stepped under another agent configuration or release.

A deploy changes the agent's prompt and tools for every thread from its next step; a thread waiting (on a
tool, a person, a timer) still shows, on its head, the release (``rel``) and configuration fingerprint
(``cfg``) of the step that left it waiting, and the first fingerprint it recorded (``cfg0``). This reads
those from every thread's head (a paginated ``Scan`` of the conversation table, filtered to heads: it
reads, and bills, the whole table — a maintenance command, not a per-request one) and lists the open
threads whose last step ran a configuration other than the current one. The current one is ``--current``,
else the configuration of the most recent commit in the table (the deployment that ran last).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from stepagent.stores.dynamodb import DynamoConversationStore
from stepagent.stores.dynamodb.io import DynamoItem, Request, s_attr
from stepagent.stores.dynamodb.layout import (
    COMMITTED_AT_ATTRIBUTE,
    CONFIG_ATTRIBUTE,
    HEAD_SK,
    RELEASE_ATTRIBUTE,
    START_CONFIG_ATTRIBUTE,
    info_from_item,
)

__all__ = ["ThreadConfig", "configs_report", "scan_configs"]

_PROJECTED = (
    "pk",
    "sk",
    "kind",
    "root_id",
    "closed",
    "version",
    "turn_complete",
    "v",
    RELEASE_ATTRIBUTE,
    CONFIG_ATTRIBUTE,
    START_CONFIG_ATTRIBUTE,
    COMMITTED_AT_ATTRIBUTE,
)


@dataclass(frozen=True, slots=True)
class ThreadConfig:
    """What one thread's head says of the release and configuration its steps ran."""

    thread_id: str
    root_id: str
    closed: bool
    waiting: bool
    release: str | None
    config: str | None
    start_config: str | None
    committed_at: int | None


async def scan_configs(store: DynamoConversationStore) -> list[ThreadConfig]:
    """Every thread of ``store``'s table with the release and configuration of its last commit."""
    io = store._io
    request: Request = {
        "TableName": store.table,
        "FilterExpression": "#sk = :head",
        "ProjectionExpression": ", ".join(f"#p{i}" for i in range(len(_PROJECTED))),
        "ExpressionAttributeNames": {f"#p{i}": name for i, name in enumerate(_PROJECTED)} | {"#sk": "sk"},
        "ExpressionAttributeValues": {":head": s_attr(HEAD_SK)},
    }
    found: list[ThreadConfig] = []
    while True:
        page = await io.call("Scan", store.table, **request)
        for item in page.get("Items", []):
            info = info_from_item(item)

            def text(name: str, item: DynamoItem = item) -> str | None:
                return str(item[name]["S"]) if name in item else None

            at = item.get(COMMITTED_AT_ATTRIBUTE, {}).get("N")
            found.append(
                ThreadConfig(
                    thread_id=info.thread_id,
                    root_id=info.root_id,
                    closed=info.closed,
                    waiting=info.turn_complete is False,
                    release=text(RELEASE_ATTRIBUTE),
                    config=text(CONFIG_ATTRIBUTE),
                    start_config=text(START_CONFIG_ATTRIBUTE),
                    committed_at=int(at) if at is not None else None,
                )
            )
        start = page.get("LastEvaluatedKey")
        if not start:
            break
        request["ExclusiveStartKey"] = start
    return sorted(found, key=lambda t: (t.root_id, t.thread_id))


def current_config(threads: list[ThreadConfig]) -> str | None:
    """The configuration of the most recent commit (``None``: no thread recorded one)."""
    recorded = [t for t in threads if t.config is not None and t.committed_at is not None]
    return max(recorded, key=lambda t: t.committed_at or 0).config if recorded else None


def configs_report(threads: list[ThreadConfig], current: str | None, *, show_all: bool) -> dict[str, Any]:
    """The open threads whose last step ran another configuration than ``current`` (all open threads with
    ``show_all``), and counts per configuration."""
    current = current or current_config(threads)
    open_threads = [t for t in threads if not t.closed]
    older = [t for t in open_threads if t.config != current]
    return {
        "current": current,
        "open_threads": len(open_threads),
        "by_config": dict(Counter(t.config or "unrecorded" for t in open_threads).most_common()),
        "threads": [asdict(t) for t in (open_threads if show_all else older)],
        "older": len(older),
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """``report`` as text for a person."""
    lines = [
        f"current configuration: {report['current'] or 'none recorded'}; "
        f"{report['older']} of {report['open_threads']} open threads last stepped under another one "
        "(their next step runs the current prompt and tools)"
    ]
    for config, count in report["by_config"].items():
        lines.append(f"  {config}: {count} open threads")
    if report["threads"]:
        lines.append(f"{'THREAD':<40} {'WAITING':<7} {'RELEASE':<12} {'CONFIG':<12} STARTED WITH")
    for t in report["threads"]:
        lines.append(
            f"{t['thread_id']:<40} {'yes' if t['waiting'] else 'no':<7} {t['release'] or '-':<12} "
            f"{t['config'] or '-':<12} {t['start_config'] or '-'}"
        )
    return lines


def as_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
