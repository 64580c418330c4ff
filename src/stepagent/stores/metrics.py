"""Counters for the I/O a store performs, so tests and benchmarks can check cost claims.

What it guarantees: every AWS call a DynamoDB store makes is counted once in :attr:`StoreMetrics.calls`
(keyed by operation name, e.g. ``"GetItem"``, ``"TransactWriteItems"``, ``"s3:PutObject"``), whether the
call succeeded or failed. ``rows_read`` counts history rows returned by ``load_rows`` (and by a thread
snapshot); ``items_read`` and ``bytes_read`` count the DynamoDB items every read returned (``GetItem``,
``BatchGetItem``, ``Query``) and their estimated size, plus the bytes of S3 objects read; ``items_written``
counts DynamoDB items put, updated or deleted; ``bytes_written`` is the estimated DynamoDB size of those
items plus the bytes of S3 objects written. The estimates are deterministic (same writes → same numbers),
which is what lets tests assert that a commit's cost does not depend on history length.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StoreMetrics:
    """Mutable I/O counters shared by the stores that were given this object."""

    calls: dict[str, int] = field(default_factory=dict)
    rows_read: int = 0
    bytes_written: int = 0
    items_written: int = 0
    items_read: int = 0
    bytes_read: int = 0

    def count_call(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()
        self.rows_read = 0
        self.bytes_written = 0
        self.items_written = 0
        self.items_read = 0
        self.bytes_read = 0

    def snapshot(self) -> StoreMetrics:
        """An independent copy (later calls do not change it)."""
        return StoreMetrics(
            calls=dict(self.calls),
            rows_read=self.rows_read,
            bytes_written=self.bytes_written,
            items_written=self.items_written,
            items_read=self.items_read,
            bytes_read=self.bytes_read,
        )

    def since(self, earlier: StoreMetrics) -> StoreMetrics:
        """What happened between ``earlier`` (a snapshot) and now."""
        calls = {op: n - earlier.calls.get(op, 0) for op, n in self.calls.items()}
        return StoreMetrics(
            calls={op: n for op, n in calls.items() if n},
            rows_read=self.rows_read - earlier.rows_read,
            bytes_written=self.bytes_written - earlier.bytes_written,
            items_written=self.items_written - earlier.items_written,
            items_read=self.items_read - earlier.items_read,
            bytes_read=self.bytes_read - earlier.bytes_read,
        )
