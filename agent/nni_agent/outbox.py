"""Sequenced records kept until the manager acknowledges them.

Every record the manager must not lose (trial status, metric, log chunk, parameter
request) gets the next sequence number of this agent boot and stays here until a
cumulative Ack covers it; after a reconnect the connection replays from the manager's
`acked_seq`. Records are kept serialized. Memory is bounded: sealed segments beyond
`memory_limit` bytes are spilled to files in `spool_dir` and read back only for replay,
so a long outage costs disk, not RAM, and nothing is dropped.
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from pathlib import Path

SEGMENT_RECORDS = 4096
SEGMENT_BYTES = 1 << 20
_LEN = struct.Struct("<I")


@dataclass
class _Segment:
    first: int  # seq of items[0]
    items: list[bytes] | None = field(default_factory=list)  # None while spilled
    count: int = 0
    nbytes: int = 0
    path: Path | None = None

    @property
    def last(self) -> int:
        return self.first + self.count - 1


class Outbox:
    """Append-only log of serialized `Record`s with cumulative acknowledgement."""

    def __init__(self, spool_dir: Path, memory_limit: int = 64 << 20) -> None:
        self.spool_dir = spool_dir
        self.memory_limit = memory_limit
        self._segments: list[_Segment] = []
        self._next_seq = 1
        self._acked = 0
        self._memory = 0
        self._changed = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    @property
    def acked_seq(self) -> int:
        return self._acked

    @property
    def memory_bytes(self) -> int:
        return self._memory

    @property
    def spilled_segments(self) -> int:
        return sum(1 for s in self._segments if s.items is None)

    def next_seq(self) -> int:
        """Reserve the sequence number for the record about to be appended."""
        return self._next_seq

    def append(self, seq: int, record: bytes) -> None:
        """Store one serialized Record whose seq was taken from `next_seq()`."""
        if seq != self._next_seq:
            raise ValueError(f"out-of-order record seq {seq}, expected {self._next_seq}")
        self._next_seq += 1
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.items is None or seg.count >= SEGMENT_RECORDS or seg.nbytes >= SEGMENT_BYTES:
            seg = _Segment(first=seq)
            self._segments.append(seg)
        assert seg.items is not None
        seg.items.append(record)
        seg.count += 1
        seg.nbytes += len(record)
        self._memory += len(record)
        if self._memory > self.memory_limit:
            self._spill()
        self._drained.clear()
        self._changed.set()

    def ack(self, seq: int) -> None:
        """Forget every record up to `seq` (the manager has stored them)."""
        if seq <= self._acked:
            return
        self._acked = min(seq, self.last_seq)
        while self._segments and self._segments[0].last <= self._acked:
            seg = self._segments.pop(0)
            if seg.items is None:
                assert seg.path is not None
                seg.path.unlink(missing_ok=True)
            else:
                self._memory -= seg.nbytes
        if self._acked >= self.last_seq:
            self._drained.set()

    def read(self, after: int, max_records: int = 2048, max_bytes: int = 1 << 20) -> tuple[int, list[bytes]]:
        """Records with seq > `after`, oldest first; returns (seq of the first, records)."""
        after = max(after, self._acked)
        out: list[bytes] = []
        size = 0
        first = after + 1
        for seg in self._segments:
            if seg.last <= after:
                continue
            items = seg.items if seg.items is not None else self._load(seg)
            for rec in items[max(0, after + 1 - seg.first):]:
                out.append(rec)
                size += len(rec)
                if len(out) >= max_records or size >= max_bytes:
                    return first, out
        return first, out

    async def wait_beyond(self, seq: int) -> None:
        """Wait until a record with seq > `seq` exists."""
        while self.last_seq <= seq:
            self._changed.clear()
            await self._changed.wait()

    async def wait_drained(self) -> None:
        """Wait until every record appended so far is acknowledged."""
        await self._drained.wait()

    def _spill(self) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        for seg in self._segments[:-1]:  # never the open tail segment
            if self._memory <= self.memory_limit // 2:
                break
            if seg.items is None:
                continue
            path = self.spool_dir / f"{seg.first:020d}.seg"
            with open(path, "wb") as f:
                for rec in seg.items:
                    f.write(_LEN.pack(len(rec)))
                    f.write(rec)
            seg.items, seg.path = None, path
            self._memory -= seg.nbytes

    @staticmethod
    def _load(seg: _Segment) -> list[bytes]:
        assert seg.path is not None
        data = seg.path.read_bytes()
        items, pos = [], 0
        while pos < len(data):
            (n,) = _LEN.unpack_from(data, pos)
            items.append(data[pos + 4 : pos + 4 + n])
            pos += 4 + n
        return items
