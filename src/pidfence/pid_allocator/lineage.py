"""The owner-only bump and roll rules over any coordinator (DESIGN.md §5 amended, §9).

Blocking code: the lease service runs it on its ZooKeeper executor. Every write is a
compare-and-set on the version just read; a lost race or an ambiguous write (connection lost
around it) is settled by re-reading, and the token stored with each write tells whether our own
earlier attempt landed. Nothing is guessed. A refusal is given on no stale view either: the
reads behind it may come from a ZooKeeper server that lags a write another lease server made, so
before refusing, the store is synced and the request decided once more (a write needs no sync:
its compare-and-set fails on a stale version).

Who may act on pid P: a caller holding P's secret, or (lineage authority, one step) the secret of
the pid that was rolled into P. Anyone else, or a pid the store does not know (never issued, or
collected after its retention), gets ``NotOwner`` with one fixed message, before any state of P
is looked at in a way that shows in the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from pidfence.pid_allocator.capability import (
    block_hint,
    issue_offset,
    make_secret,
    secret_matches,
)
from pidfence.pid_allocator.coordinator import (
    Ambiguous,
    Block,
    Conflict,
    Coordinator,
    LineageRecord,
    RollWrite,
)
from pidfence.pid_allocator.errors import (
    LeaseCapacityExhausted,
    LeaseServiceUnavailable,
    NotOwner,
    StaleGeneration,
    UnknownPid,
)
from pidfence.pid_allocator.generations import GENERATION_LIMIT, initial_generation

#: The only text a non-owner ever gets back: identical for unknown pids and wrong secrets.
NOT_OWNER_MESSAGE = "not the owner of this pid (or no such pid): send the secret from its lease"

_ATTEMPTS = 64
#: What a request may be told without a write: decided again on a synced view before it is final.
_REFUSALS = (NotOwner, StaleGeneration, UnknownPid)
P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LocalLease:
    """What the issuing server's ring knows of a live pid it handed out."""

    generation: int
    expire_ms: int


@dataclass(frozen=True, slots=True)
class Change:
    """One bump or roll as a lease server received it.

    Attributes:
        pid: the pid to move on.
        generation: the caller's current generation of it.
        secret: its secret, or that of the pid rolled into it (lineage authority).
        token: the idempotency token stored with the write (a retry with it is answered).
        now_ms: the server's time of the request.
        local: what this server's ring knows of the pid, if it issued it.
    """

    pid: int
    generation: int
    secret: bytes
    token: str
    now_ms: int
    local: LocalLease | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A granted lease, bump or roll: the pid (the successor for a roll), its generation and
    lease end, the block it came from and its own secret."""

    pid: int
    generation: int
    expire_ms: int
    block: Block
    secret: bytes


@dataclass(frozen=True, slots=True)
class _State:
    record: LineageRecord | None
    version: int | None
    generation: int
    expire_ms: int
    block: Block
    secret: bytes


def own_secret(block: Block, pid: int, record: LineageRecord) -> bytes:
    """The secret of ``pid`` (from ``block``), a pid a roll created: its lineage record keeps
    its issue offset (empty, matching nothing, where a record has none)."""
    if record.offset is None:
        return b""
    return make_secret(block.start, block.salt, pid, record.offset)


class Lineage:
    """Bump and roll by compare-and-set, with owner checks and retention.

    Args:
        store: the coordinator (ZooKeeper or memory).
        retention_ms: retired and expired pids stay known this long past their lease end.
    """

    def __init__(self, store: Coordinator, retention_ms: int) -> None:
        self.store = store
        self.retention_ms = retention_ms

    def _final(self, decide: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``decide``, and when it refuses, ``decide`` again after a sync: the refusal stands
        only on a view that holds every write acknowledged before it."""
        try:
            return decide(*args, **kwargs)
        except _REFUSALS:
            self.store.sync()
        return decide(*args, **kwargs)

    # -- ownership ------------------------------------------------------------------------------

    def _state(self, change: Change) -> _State:
        pid, secret, now_ms = change.pid, change.secret, change.now_ms
        hint = block_hint(secret)
        given = self.store.block_at(hint) if hint is not None else None
        found = self.store.read_lineage(pid)
        record, version = found if found is not None else (None, None)
        block: Block | None = None
        own = secret
        if (
            given is not None
            and pid in given
            and secret_matches(secret, given.start, given.salt, pid)
        ):
            block = given
        elif (
            record is not None
            and record.predecessor is not None
            and given is not None
            and record.predecessor in given
            and secret_matches(secret, given.start, given.salt, record.predecessor)
        ):
            block = self.store.block_at(record.block) if record.block else None
            own = b"" if block is None else own_secret(block, pid, record)
        if block is None:
            raise NotOwner(NOT_OWNER_MESSAGE)
        if record is not None:
            if now_ms >= record.expire_ms + self.retention_ms:
                raise NotOwner(NOT_OWNER_MESSAGE)  # past retention: as if collected already
            return _State(record, version, record.generation, record.expire_ms, block, own)
        if now_ms >= block.forgotten_at(self.retention_ms):
            raise NotOwner(NOT_OWNER_MESSAGE)  # its record may be collected: never start over
        local = change.local
        if local is not None:
            return _State(None, None, local.generation, local.expire_ms, block, own)
        # Another server issued it: the secret says exactly when, so this server grants and
        # records the end the issuer granted, and refuses past its retention as a record would.
        expire_ms = block.issued_end(issue_offset(own) or 0)
        if now_ms >= expire_ms + self.retention_ms:
            raise NotOwner(NOT_OWNER_MESSAGE)
        return _State(None, None, initial_generation(block.salt, pid), expire_ms, block, own)

    @staticmethod
    def _stale(pid: int, generation: int, record: LineageRecord | None) -> StaleGeneration:
        if record is not None and record.retired:
            return StaleGeneration(
                f"pid {pid} was retired by a roll into pid {record.successor}: this producer is "
                "fenced; a resumer follows the successor",
                record.successor,
                record.successor_generation,
            )
        return StaleGeneration(
            f"pid {pid} is not at generation {generation}: another producer took it over "
            "(this one is fenced); stop writing with this pid"
        )

    # -- bump -----------------------------------------------------------------------------------

    @staticmethod
    def ended(expire_ms: int, now_ms: int) -> bool:
        """Whether a lease ending at ``expire_ms`` has ended: then it is not bumped, only rolled
        (DESIGN.md §9)."""
        return expire_ms <= now_ms

    def bump(self, change: Change) -> Outcome:
        """Move ``change.pid`` from ``change.generation`` (its current one) to the next one.

        Raises:
            NotOwner, StaleGeneration, UnknownPid (expired: roll it), LeaseCapacityExhausted,
            LeaseServiceUnavailable.
        """
        return self._final(self._bump, change)

    def _bump(self, change: Change) -> Outcome:
        pid, generation, token = change.pid, change.generation, change.token
        for _ in range(_ATTEMPTS):
            state = self._state(change)
            record = state.record
            if record is not None and record.retired:
                raise self._stale(pid, generation, record)
            if generation != state.generation:
                if (
                    record is not None
                    and record.token == token
                    and state.generation == generation + 1
                ):
                    return Outcome(
                        pid, record.generation, record.expire_ms, state.block, state.secret
                    )
                raise self._stale(pid, generation, record)
            if self.ended(state.expire_ms, change.now_ms):
                raise UnknownPid(
                    f"the lease of pid {pid} ended at {state.expire_ms}: roll it to continue its "
                    "lineage, or lease a new pid"
                )
            if generation + 1 >= GENERATION_LIMIT:
                raise LeaseCapacityExhausted(f"pid {pid} used every generation; roll it")
            new = LineageRecord(
                generation + 1,
                state.expire_ms,
                token,
                state.block.start,
                predecessor=None if record is None else record.predecessor,
                offset=None if record is None else record.offset,
            )
            try:
                self.store.write_lineage(pid, new, state.version)
            except (Conflict, Ambiguous):
                continue  # the re-read decides (our token there means it landed)
            return Outcome(pid, new.generation, new.expire_ms, state.block, state.secret)
        raise LeaseServiceUnavailable(f"generation contention on pid {pid}; retry")

    # -- roll -----------------------------------------------------------------------------------

    def check_roll(self, change: Change) -> Outcome | None:
        """Refuse a roll that cannot succeed before a successor pid is taken for it.

        Returns:
            The earlier outcome when a roll with this ``token`` already landed, else None.

        Raises:
            NotOwner, StaleGeneration, LeaseServiceUnavailable.
        """
        return self._final(lambda: self._landed_roll(self._state(change), change))

    def _landed_roll(self, state: _State, change: Change) -> Outcome | None:
        """The earlier successor when this ``change.token``'s roll already landed; None when the
        pid may still be rolled at ``change.generation``; else :class:`StaleGeneration`."""
        pid, generation, token = change.pid, change.generation, change.token
        record = state.record
        if record is not None and record.retired:
            if record.token == token:
                return self._successor_of(record)
            raise self._stale(pid, generation, record)
        if generation != state.generation:
            raise self._stale(pid, generation, record)
        return None

    def _successor_of(self, record: LineageRecord) -> Outcome:
        assert record.successor is not None and record.successor_generation is not None  # noqa: S101
        found = self.store.read_lineage(record.successor)
        block = None if found is None else self.store.block_at(found[0].block)
        if found is None or block is None:
            raise LeaseServiceUnavailable("the successor's record is gone; lease a new pid")
        successor = found[0]
        return Outcome(
            record.successor,
            record.successor_generation,
            successor.expire_ms,
            block,
            own_secret(block, record.successor, successor),
        )

    def roll(self, change: Change, successor: Outcome) -> Outcome:
        """Retire ``change.pid`` at ``change.generation`` (its current one) and record
        ``successor``.

        A pid whose lease ended may still be rolled during its retention: that is how a resumer
        of an expired checkpoint continues its lineage (and fences a zombie's later roll).

        Returns:
            The successor (or, for a retried token that already landed, the earlier successor).

        Raises:
            NotOwner, StaleGeneration, LeaseServiceUnavailable.
        """
        return self._final(self._roll, change, successor)

    def _roll(self, change: Change, successor: Outcome) -> Outcome:
        pid, token = change.pid, change.token
        for _ in range(_ATTEMPTS):
            state = self._state(change)
            landed = self._landed_roll(state, change)
            if landed is not None:
                return landed
            record = state.record
            retired = LineageRecord(
                state.generation,
                state.expire_ms,
                token,
                state.block.start,
                successor.pid,
                successor.generation,
                None if record is None else record.predecessor,
                None if record is None else record.offset,
            )
            created = LineageRecord(
                successor.generation,
                successor.expire_ms,
                token,
                successor.block.start,
                predecessor=pid,
                offset=issue_offset(successor.secret),
            )
            try:
                self.store.write_roll(
                    RollWrite(pid, retired, state.version, successor.pid, created)
                )
            except (Conflict, Ambiguous):
                continue
            return successor
        raise LeaseServiceUnavailable(f"generation contention on pid {pid}; retry")
