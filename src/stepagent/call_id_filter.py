"""A fixed-size Bloom filter of tool call ids: the ids a compaction summary hides from view.

Why: call ids must be unique in a thread (``core/history.py``), so before a model's new call is committed
the step asks whether its id is taken. The visible history answers that unless a summary hides older calls;
then the exact answer costs a store read of the answered markers. A summary carries this filter of every
id it hides, so that read is needed only when the filter says "maybe".

What it guarantees:

- **No false negatives.** :meth:`CallIdFilter.might_contain` is ``True`` for every id ever added to the
  filter or to any filter unioned into it. ``False`` proves the id was never added; ``True`` only means
  "maybe" (ask the exact source).
- **Deterministic.** Bit positions come from BLAKE2b of the id's UTF-8 bytes (never Python's salted
  ``hash()``), so the same ids give the same bits in every process, on every machine, in every version
  that writes :data:`FORMAT`.
- **Fixed size.** :data:`BITS` = 8,192 bits (1 KiB; :meth:`CallIdFilter.encode` adds one format byte),
  :data:`HASHES` = 7 positions per id (double hashing, Kirsch-Mitzenmacher). At the intended capacity of
  :data:`CAPACITY` = 800 ids the false-positive rate is ≤ :data:`FALSE_POSITIVE_BOUND` (1 %; theory 0.73 %).
  Past it the rate rises (about 10 % at 1,500 ids, 25 % at 2,000): the filter becomes less useful,
  never wrong.
- **Forward compatible.** :meth:`CallIdFilter.decode` returns ``None`` (unknown: ask the exact source) for
  bytes of any other format or size, so a reader never trusts a filter it does not understand.

Pure: no I/O, no stepagent imports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BITS", "CAPACITY", "ENCODED_BYTES", "FALSE_POSITIVE_BOUND", "FORMAT", "HASHES", "CallIdFilter"]

BITS = 8192
HASHES = 7
CAPACITY = 800
FALSE_POSITIVE_BOUND = 0.01
#: The first byte of an encoded filter (this layout: ``BITS``, ``HASHES``, BLAKE2b positions, little-endian).
FORMAT = 1
_BYTES = BITS // 8
#: The size of :meth:`CallIdFilter.encode`'s output.
ENCODED_BYTES = 1 + _BYTES
_PERSON = b"stepagent.callid"  # BLAKE2b personalisation: these digests are used for nothing else


def _positions(tool_call_id: str) -> list[int]:
    digest = hashlib.blake2b(tool_call_id.encode("utf-8"), digest_size=16, person=_PERSON).digest()
    first = int.from_bytes(digest[:8], "little")
    step = int.from_bytes(digest[8:], "little") | 1  # odd: with BITS a power of two, k distinct positions
    return [(first + i * step) % BITS for i in range(HASHES)]


@dataclass(frozen=True, slots=True)
class CallIdFilter:
    """An immutable set of call ids that can only say "certainly absent" or "maybe present"."""

    #: The filter's bits (bit ``i`` of this integer is position ``i``).
    bits: int = 0

    @classmethod
    def of(cls, tool_call_ids: Iterable[str]) -> CallIdFilter:
        """The filter holding exactly ``tool_call_ids`` (so far as a Bloom filter holds anything)."""
        return cls().with_ids(tool_call_ids)

    def with_ids(self, tool_call_ids: Iterable[str]) -> CallIdFilter:
        """This filter plus ``tool_call_ids``."""
        bits = self.bits
        for tool_call_id in tool_call_ids:
            for position in _positions(tool_call_id):
                bits |= 1 << position
        return CallIdFilter(bits)

    def union(self, other: CallIdFilter) -> CallIdFilter:
        """A filter that may contain every id either may contain."""
        return CallIdFilter(self.bits | other.bits)

    def might_contain(self, tool_call_id: str) -> bool:
        """``False``: ``tool_call_id`` was certainly never added. ``True``: it may have been."""
        bits = self.bits
        return all(bits >> position & 1 for position in _positions(tool_call_id))

    @property
    def bits_set(self) -> int:
        """How many of the :data:`BITS` positions are set (how full the filter is)."""
        return self.bits.bit_count()

    def encode(self) -> bytes:
        """:data:`FORMAT` followed by the 1,024 bytes of the bits (little-endian)."""
        return bytes([FORMAT]) + self.bits.to_bytes(_BYTES, "little")

    @classmethod
    def decode(cls, data: bytes) -> CallIdFilter | None:
        """The filter :meth:`encode` wrote, or ``None`` for bytes of another format or size (unknown)."""
        if len(data) != ENCODED_BYTES or data[0] != FORMAT:
            return None
        return cls(int.from_bytes(data[1:], "little"))
