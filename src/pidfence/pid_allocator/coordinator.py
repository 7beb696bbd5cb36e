"""What a lease server needs from its coordination store (ZooKeeper, or memory in unit tests).

Calls are blocking; the server runs them on an executor, never on its event loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import msgpack


@dataclass(frozen=True, slots=True)
class BlockRequest:
    """What a claim asks for; the store decides where the block starts.

    Attributes:
        size: how many pids.
        owner: id of the server that claims it.
        token: random claim token; tells an ambiguous claim apart on re-read.
        claimed_ms: claim time (epoch ms).
        lifetime_ms: lease lifetime of pids issued from it.
        ttl_ms: the owner issues from this block only before ``claimed_ms + ttl_ms``.
        salt: key of the starting-generation hash.
    """

    size: int
    owner: str
    token: str
    claimed_ms: int
    lifetime_ms: int
    ttl_ms: int
    salt: bytes

    def placed(self, start: int) -> Block:
        """The block this request becomes when the store places it at ``start``."""
        return Block(**asdict(self), start=start)


@dataclass(frozen=True, slots=True)
class Block(BlockRequest):
    """A claimed range of pids ``[start, end)``: a request the store placed at ``start``, with
    what any server needs to judge its pids."""

    start: int

    @property
    def end(self) -> int:
        """One past the last pid."""
        return self.start + self.size

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.start <= pid < self.end

    @property
    def last_expiry_ms(self) -> int:
        """No lease issued from this block lives past this instant."""
        return self.claimed_ms + self.ttl_ms + self.lifetime_ms

    def forgotten_at(self, retention_ms: int) -> int:
        """From this instant every server refuses a pid of this block that has no lineage
        record (its last lease's end plus retention): the block-level refusal."""
        return self.last_expiry_ms + retention_ms

    def issued_end(self, offset_ms: int) -> int:
        """The end of a lease issued ``offset_ms`` after the claim."""
        return self.claimed_ms + offset_ms + self.lifetime_ms

    def encode(self) -> bytes:
        """The block record's znode data."""
        data: bytes = msgpack.packb(
            {
                "v": 1,
                "start": self.start,
                "end": self.end,
                "owner": self.owner,
                "token": self.token,
                "claimed_ms": self.claimed_ms,
                "lifetime_ms": self.lifetime_ms,
                "ttl_ms": self.ttl_ms,
                "salt": self.salt,
            },
            use_bin_type=True,
        )
        return data

    @classmethod
    def decode(cls, data: bytes) -> Block:
        """Parse a block record written by ``encode``."""
        m: dict[str, Any] = msgpack.unpackb(data, raw=False)
        start = int(m["start"])
        request = BlockRequest(
            int(m["end"]) - start,
            str(m["owner"]),
            str(m["token"]),
            int(m["claimed_ms"]),
            int(m["lifetime_ms"]),
            int(m["ttl_ms"]),
            bytes(m["salt"]),
        )
        return request.placed(start)


@dataclass(frozen=True, slots=True)
class LineageRecord:
    """A pid's shared state once it was bumped or rolled (ZooKeeper ``generations/<pid>``).

    Attributes:
        generation: the pid's current generation (a retired pid keeps the one it retired at).
        expire_ms: its lease end (epoch ms); the record is kept ``retention`` past it.
        token: the token of the write that made this version (settles ambiguous writes and
            makes client retries idempotent).
        block: start of the block that issued the pid (its secret is computed from that block).
        successor: the pid it was rolled into; set means retired.
        successor_generation: the successor's starting generation.
        predecessor: the pid that was rolled into this one (lineage authority, one step).
        offset: for a pid a roll created, its issue offset (ms after its block's claim): what
            rebuilds its secret for a caller holding its predecessor's (None: not made by a
            roll).
    """

    generation: int
    expire_ms: int
    token: str
    block: int = 0
    successor: int | None = None
    successor_generation: int | None = None
    predecessor: int | None = None
    offset: int | None = None

    @property
    def retired(self) -> bool:
        """Rolled into a successor: no bump or roll of it succeeds any more."""
        return self.successor is not None

    def forgotten_at(self, block: Block | None, retention_ms: int) -> int:
        """When garbage collection may delete this record of a pid of ``block``.

        The record refuses every request from its own end plus retention on, but without it the
        pid would be judged by its block, which answers until :meth:`Block.forgotten_at`: so the
        record is kept until then (a pid never goes back to its starting generation, nor rolls
        twice). When the block record is gone already, its pids are refused anyway.
        """
        own = self.expire_ms + retention_ms
        return own if block is None else max(own, block.forgotten_at(retention_ms))

    def encode(self) -> bytes:
        """The znode data."""
        fields: dict[str, Any] = {"g": self.generation, "e": self.expire_ms, "t": self.token}
        if self.block:
            fields["b"] = self.block
        if self.successor is not None:
            fields["s"] = self.successor
            fields["sg"] = self.successor_generation
        if self.predecessor is not None:
            fields["p"] = self.predecessor
        if self.offset is not None:
            fields["o"] = self.offset
        data: bytes = msgpack.packb(fields, use_bin_type=True)
        return data

    @classmethod
    def decode(cls, data: bytes) -> LineageRecord:
        """Parse znode data (also the round-1 ``{g, e, t}`` records; unknown keys are ignored,
        so older servers read newer records)."""
        m: dict[str, Any] = msgpack.unpackb(data, raw=False)
        successor = m.get("s")
        predecessor = m.get("p")
        offset = m.get("o")
        return cls(
            int(m["g"]),
            int(m["e"]),
            str(m["t"]),
            int(m.get("b", 0)),
            None if successor is None else int(successor),
            None if successor is None else int(m["sg"]),
            None if predecessor is None else int(predecessor),
            None if offset is None else int(offset),
        )


@dataclass(frozen=True, slots=True)
class RollWrite:
    """The two records one roll writes, both or neither.

    Attributes:
        pid: the pid retired.
        record: its retired record, written by compare-and-set on ``version`` (None: create).
        version: the version of ``pid``'s record the roll read.
        successor: the pid it is rolled into.
        successor_record: the successor's new record (created: it must not exist yet).
    """

    pid: int
    record: LineageRecord
    version: int | None
    successor: int
    successor_record: LineageRecord


class Conflict(Exception):
    """A compare-and-set lost to another writer: re-read and decide again."""


class Ambiguous(Exception):
    """A write's outcome is unknown (connection lost around it); the store is connected again
    and the caller must re-read, never guess."""


class Coordinator(Protocol):
    """Shared state of every lease server: pid blocks and lineage records.

    Writes are compare-and-set on a version read before; the lineage rules themselves live in
    ``lineage.py`` so ZooKeeper and the in-memory store cannot disagree on them.
    """

    @property
    def connected(self) -> bool:
        """Whether the store is reachable now (False while ZooKeeper is SUSPENDED or LOST)."""
        ...

    @property
    def writes(self) -> int:
        """Write transactions sent so far (for metrics and the bench)."""
        ...

    def claim_block(self, request: BlockRequest) -> Block:
        """Claim the next free block of ``request.size`` pids.

        Raises:
            LeaseServiceUnavailable: the store is unreachable or the outcome could not be read.
        """
        ...

    def block_at(self, start: int) -> Block | None:
        """The block record starting at ``start`` (one read, cached), or None. Never lists."""
        ...

    def read_lineage(self, pid: int) -> tuple[LineageRecord, int] | None:
        """(record, version) of ``pid``, or None when it was never bumped or rolled."""
        ...

    def sync(self) -> None:
        """Make the reads that follow see every write the store acknowledged before this call,
        whichever server made it (a ZooKeeper server may lag its leader; a write's
        compare-and-set never trusts a stale read, an answer given without a write would).

        Raises:
            LeaseServiceUnavailable: the store is unreachable.
        """
        ...

    def write_lineage(self, pid: int, record: LineageRecord, version: int | None) -> None:
        """Create (``version`` None) or compare-and-set the record of ``pid``. As in ZooKeeper,
        version -1 would set whatever version is there: the lineage rules never pass it.

        Raises:
            Conflict: another writer got there first.
            Ambiguous: the outcome is unknown; re-read.
            LeaseServiceUnavailable: the store is unreachable.
        """
        ...

    def write_roll(self, roll: RollWrite) -> None:
        """Atomically retire ``roll.pid`` (as ``write_lineage``) and create its successor's record.

        Raises:
            Conflict, Ambiguous, LeaseServiceUnavailable: as ``write_lineage``.
        """
        ...

    def collect_garbage(self, now_ms: int, retention_ms: int) -> int:
        """Delete the lineage records (:meth:`LineageRecord.forgotten_at`) and block records
        (:meth:`Block.forgotten_at`) no request can be granted about any more at ``now_ms``,
        each at the version read; return how many were deleted."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
