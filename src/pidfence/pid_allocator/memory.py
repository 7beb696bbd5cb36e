"""An in-memory coordinator: the ZooKeeper rules without ZooKeeper, for unit tests and demos."""

from __future__ import annotations

import threading

from pidfence.pid_allocator.coordinator import (
    Ambiguous,
    Block,
    BlockRequest,
    Conflict,
    LineageRecord,
    RollWrite,
)
from pidfence.pid_allocator.errors import LeaseServiceUnavailable


class MemoryCoordinator:
    """Thread-safe stand-in for ``ZkCoordinator``; share one between servers to model a cluster.

    Fault hooks for tests: ``up = False`` models an unreachable ZooKeeper (every call answers
    UNAVAILABLE); ``lose_after_write(n)`` makes the next ``n`` writes land and then report an
    ambiguous outcome, as a connection lost right after the commit does; ``lose_before_write(n)``
    makes them report it without landing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._blocks: dict[int, Block] = {}
        self._records: dict[int, tuple[LineageRecord, int]] = {}
        #: Write transactions so far.
        self.writes = 0
        self._lost_after = 0
        self._lost_before = 0
        self.block_reads = 0
        self.up = True

    @property
    def connected(self) -> bool:
        """False while a test says the store is down."""
        return self.up

    def lose_after_write(self, count: int = 1) -> None:
        """The next ``count`` writes land, then report an ambiguous outcome."""
        self._lost_after = count

    def lose_before_write(self, count: int = 1) -> None:
        """The next ``count`` writes report an ambiguous outcome without landing."""
        self._lost_before = count

    def _check_up(self) -> None:
        if not self.up:
            raise LeaseServiceUnavailable("coordination store unreachable; retry shortly")

    def claim_block(self, request: BlockRequest) -> Block:
        """Claim ``[next, next + size)``."""
        with self._lock:
            self._check_up()
            start = self._next
            block = request.placed(start)
            self._next = block.end
            self._blocks[start] = block
            self.writes += 1
            return block

    def block_at(self, start: int) -> Block | None:
        """The block starting at ``start``."""
        with self._lock:
            self._check_up()
            self.block_reads += 1
            return self._blocks.get(start)

    def read_lineage(self, pid: int) -> tuple[LineageRecord, int] | None:
        """(record, version) of ``pid``."""
        with self._lock:
            self._check_up()
            return self._records.get(pid)

    def sync(self) -> None:
        """Nothing to catch up with: every read sees every write."""
        with self._lock:
            self._check_up()

    def _fault(self) -> bool:
        """True: land the write, then report Ambiguous. Raises Ambiguous for a lost write."""
        if self._lost_before:
            self._lost_before -= 1
            raise Ambiguous("write lost before it landed (test hook)")
        if self._lost_after:
            self._lost_after -= 1
            return True
        return False

    def _check_version(self, pid: int, record: LineageRecord, version: int | None) -> int:
        held = self._records.get(pid)
        if version is None:
            if held is not None:
                raise Conflict(f"record of pid {pid} exists")
            if record.block not in self._blocks:  # as ZkCoordinator's check in the multi
                raise Conflict(f"block of pid {pid} was collected")
            return 0
        if held is None or version not in (-1, held[1]):  # -1: any version, as in ZooKeeper
            raise Conflict(f"record of pid {pid} changed")
        return held[1] + 1

    def write_lineage(self, pid: int, record: LineageRecord, version: int | None) -> None:
        """Create or compare-and-set the record of ``pid``."""
        with self._lock:
            self._check_up()
            ambiguous = self._fault()
            new_version = self._check_version(pid, record, version)
            self._records[pid] = (record, new_version)
            self.writes += 1
        if ambiguous:
            raise Ambiguous("write landed; reply lost (test hook)")

    def write_roll(self, roll: RollWrite) -> None:
        """Retire ``roll.pid`` and create its successor's record, both or neither."""
        with self._lock:
            self._check_up()
            ambiguous = self._fault()
            new_version = self._check_version(roll.pid, roll.record, roll.version)
            self._check_version(roll.successor, roll.successor_record, None)
            self._records[roll.pid] = (roll.record, new_version)
            self._records[roll.successor] = (roll.successor_record, 0)
            self.writes += 1
        if ambiguous:
            raise Ambiguous("roll landed; reply lost (test hook)")

    def collect_garbage(self, now_ms: int, retention_ms: int) -> int:
        """Drop the block records, then the lineage records, no request can be granted about
        any more (``forgotten_at``)."""
        with self._lock:
            self._check_up()
            blocks, records = self._blocks, self._records
            old_blocks = [s for s, b in blocks.items() if b.forgotten_at(retention_ms) <= now_ms]
            for start in old_blocks:
                del blocks[start]
            old_records = [
                p
                for p, (r, _) in records.items()
                if r.forgotten_at(blocks.get(r.block), retention_ms) <= now_ms
            ]
            for pid in old_records:
                del records[pid]
            return len(old_blocks) + len(old_records)

    def close(self) -> None:
        """Nothing to release."""
