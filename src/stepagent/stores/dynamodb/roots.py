"""Listing the root threads of a conversation table, newest first (for the web console).

The table has no index of roots: a conversation is found by its id. :func:`scan_roots` is the honest
alternative to adding one — a paginated ``Scan`` of the whole conversation table, filtered server-side to
``HEAD`` items of kind ``root`` and projected to the few head attributes a list shows. What it costs:

- A Scan reads (and bills) every item of the table, rows included, whatever the filter keeps: about
  table size / 8 KB read units per full pass (eventually consistent), one request per 1 MB. Fine for a
  development stack and small deployments; for a large table pass ``max_pages`` (the list then says it is
  incomplete) or keep your own index of conversations.
- Eventually consistent: a conversation created a moment ago may be missing from one pass.

Order: newest first by ``created_at`` (epoch milliseconds of the thread's first commit, written by
:class:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore` since the console exists); heads without it
(older data, imported trees) come last, by id.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepagent.stores.base import ThreadKind
from stepagent.stores.dynamodb.conversation import DynamoConversationStore
from stepagent.stores.dynamodb.io import Request, s_attr
from stepagent.stores.dynamodb.layout import CREATED_AT_ATTRIBUTE, HEAD_SK, info_from_item

__all__ = ["RootListing", "RootSummary", "scan_roots"]

# Placeholders for every name (several are DynamoDB reserved words).
_PROJECTED = (
    "pk",
    "sk",
    "kind",
    "root_id",
    "closed",
    "version",
    "tail",
    "turn_complete",
    CREATED_AT_ATTRIBUTE,
)


@dataclass(frozen=True, slots=True)
class RootSummary:
    """What the list shows of one root thread, from its head alone."""

    thread_id: str
    created_at: int | None
    version: int
    tail: int
    closed: bool
    turn_complete: bool | None


@dataclass(frozen=True, slots=True)
class RootListing:
    """A page of root conversations from the table scan, and whether the scan reached the end."""

    roots: list[RootSummary]
    #: False when ``max_pages`` stopped the scan before the end of the table.
    complete: bool
    pages: int


async def scan_roots(store: DynamoConversationStore, *, max_pages: int | None = None) -> RootListing:
    """Every root thread of ``store``'s table (see the module docstring for the cost), newest first."""
    io = store._io
    request: Request = {
        "TableName": store.table,
        "FilterExpression": "#sk = :head AND #kind = :root",
        "ProjectionExpression": ", ".join(f"#{name}" for name in _PROJECTED),
        "ExpressionAttributeNames": {f"#{name}": name for name in _PROJECTED},
        "ExpressionAttributeValues": {":head": s_attr(HEAD_SK), ":root": s_attr(ThreadKind.ROOT.value)},
    }
    roots: list[RootSummary] = []
    pages = 0
    while True:
        page = await io.call("Scan", store.table, **request)
        pages += 1
        for item in page.get("Items", []):
            info = info_from_item(item)
            created = item.get(CREATED_AT_ATTRIBUTE, {}).get("N")
            roots.append(
                RootSummary(
                    thread_id=info.thread_id,
                    created_at=int(created) if created is not None else None,
                    version=info.version,
                    tail=info.tail,
                    closed=info.closed,
                    turn_complete=info.turn_complete,
                )
            )
        start = page.get("LastEvaluatedKey")
        if not start:
            complete = True
            break
        if max_pages is not None and pages >= max_pages:
            complete = False
            break
        request["ExclusiveStartKey"] = start
    roots.sort(key=lambda r: (r.created_at is None, -(r.created_at or 0), r.thread_id))
    return RootListing(roots, complete, pages)
