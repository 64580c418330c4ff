"""Format versions of everything stepagent stores or queues, and the rule for reading them.

Threads outlive releases: a thread a release left waiting (on a tool, an approval, a timer, a child) is
continued by the next release from the items and messages the previous one wrote, and a rollback meets
what the newer release wrote. So every stored item (history rows, heads, state items, live items, export
files) and every queued message (input, tool, delay, output) carries a format version, and every reader
checks it before it decodes anything.

What it guarantees:

- Writers stamp :data:`FORMAT_VERSION`: the attribute ``v`` on every DynamoDB item
  (:mod:`stepagent.stores.dynamodb.io`), the ``stepagent_format`` message attribute on every queued
  message (:mod:`stepagent.senders.sqs`; the body stays byte for byte what consumers know), the field
  ``"v"`` of a body that cannot carry attributes (an EventBridge Scheduler target, :func:`stamp_body`; the
  tool queue's body has always had one), ``version`` in an export file's header.
- A missing version is version 1 (the format of the release before versions were written), so every
  existing item and message reads as it always did.
- A reader meeting a version above :data:`READS_UP_TO` raises :class:`NewerFormatError`, which names the
  version and what this release reads; it is never decoded by guesswork. That error rejects the input
  that led to the read (the worker dead-letters it with the reason in ``stepagent_error``), so a rollback
  leaves the newer data untouched and the message can be redriven after rolling forward again.

The rule for a release that changes a format: an additive change that an older reader may ignore (a new
optional attribute) keeps the version; a change an older reader would misread bumps
:data:`FORMAT_VERSION`, raises :data:`READS_UP_TO` with it, and brings its migration (the reader of the old
version) in the same release. ``tests/corpus`` holds bytes recorded from earlier releases; the corpus tests
continue every thread in them with today's code.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from stepagent.errors import NewerFormatError

__all__ = [
    "FORMAT_FIELD",
    "FORMAT_VERSION",
    "READS_UP_TO",
    "check_version",
    "item_version",
    "running_release",
    "stamp_body",
]

#: The format this release writes.
FORMAT_VERSION = 1
#: The newest format this release can read (every version from 1 up to it).
READS_UP_TO = 1
#: The name of the version: a DynamoDB attribute (``{"N": "1"}``) and a field of queued JSON bodies.
FORMAT_FIELD = "v"


def check_version(version: object, what: str) -> int:
    """The format version ``version`` (``None``: 1), or :class:`NewerFormatError` naming ``what`` when this
    release cannot read it (a version above :data:`READS_UP_TO`, or one that is not a positive integer,
    which no release writes)."""
    if version is None:
        return 1
    number: int | None
    try:
        number = None if isinstance(version, bool) else int(str(version))
    except ValueError:
        number = None
    if number is None or number < 1:
        raise NewerFormatError(
            f"{what} has format version {version!r}, which no stepagent release writes (this release reads "
            f"v1 to v{READS_UP_TO})"
        )
    if number > READS_UP_TO:
        raise NewerFormatError(
            f"{what} was written by a newer stepagent (format v{version}; this release reads up to "
            f"v{READS_UP_TO}): deploy that release again, or redrive this message after it is back"
        )
    return number


def item_version(item: dict[str, Any], what: str) -> int:
    """The checked format version of a DynamoDB item in the low-level wire form."""
    value = item.get(FORMAT_FIELD)
    return check_version(value.get("N") if isinstance(value, dict) else value, what)


def stamp_body(body: str) -> str:
    """A queued JSON object body with this release's format version as its first field (unchanged if it
    has a version already, or is not a JSON object). String work, not a re-encode: the body's own bytes
    after the version are kept, so its dedup ids and claim checks are unchanged by the stamp."""
    if not body.startswith("{") or body.startswith(f'{{"{FORMAT_FIELD}":'):
        return body
    rest = body[1:].lstrip()
    separator = "" if rest.startswith("}") else ","
    return f'{{"{FORMAT_FIELD}":{FORMAT_VERSION}{separator}{rest}'


@functools.cache
def running_release() -> str:
    """The version of the installed ``stepagent`` (what a commit records as the release that made it)."""
    try:
        return version("stepagent")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
