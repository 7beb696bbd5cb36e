"""Deliberately broken builds: patches that a proof must catch (its teeth).

Each mutation changes the product the way a plausible bug would, in the process that installs it
(``python -m pidfence.testing.run --mutation NAME -- produce ...``), through the public API only,
so it survives refactors of the code it breaks. A test runs the proof with a mutation installed
and asserts that the proof fails.

* ``resend-new-seq-on-timeout``: a record not acknowledged within
  :data:`RESEND_AFTER_S` is sent again as a new record (a new seq), as an application that
  "retries on timeout" above the producer would do. When the first copy did land (its reply was
  lost on the way back) the same event is appended twice: ``event_duplicate``.
* ``lease-share-per-connection``: the lease server gives each connection the share meant for
  each client (its turns, in-flight bound and rate buckets), so a flooder's connection count
  buys it more of the server, as a server keyed by connection would.
* ``copy-commit-without-bump``: :meth:`~pidfence.producer.IdempotentProducer.bump` returns the
  checkpoint without a bump, so a copy group member's commit rests on the checkpoint's own
  ownership question alone (switched off too, it commits records another owner's takeover had
  fenced: those events are lost).
* ``bump-without-fence``: :meth:`~pidfence.producer.IdempotentProducer.bump` writes no FENCE,
  so a generation whose records were all re-sends (``DUPLICATE``) never reaches the sink, and a
  copy task's records two bumps later are ``INVALID_GENERATION``: lost.
* ``producer-without-lock``: ``IdempotentProducer``'s lock does nothing, so threads sharing a
  producer take, stamp and hand over seqs unguarded (the producer before issue 42): two records
  get one (pid, generation, seq) and the sink keeps only the first.

Further down, each with its docstring: the lease authority's lineage mutants (``lineage-*``,
:data:`LINEAGE_MUTATIONS`) and the mutants of gap resolution and adoption (``forget-holes``,
``describe-end-plus-retention``). A mutation patches the process that installs it and no other:
through ``pidfence.testing.run`` it does not reach the Python workers Spark starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from pidfence.wire import PidfenceError

#: How long the broken producer waits for an acknowledgement before it re-sends.
RESEND_AFTER_S = 1.0


class UnknownMutation(PidfenceError):
    """A mutation name that does not exist; the message lists the names that do."""


class _Pending:
    """Records a broken producer sent and has not seen acknowledged, with their send time."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[float, dict[str, Any]]] = {}
        self.next_token = 0


def _resend_new_seq_on_timeout() -> None:
    from pidfence.producer import IdempotentProducer

    produce, poll, flush = (
        IdempotentProducer.produce,
        IdempotentProducer.poll,
        IdempotentProducer.flush,
    )

    def pending_of(producer: Any) -> _Pending:
        found: _Pending | None = producer.__dict__.get("_mutation_pending")
        if found is None:
            found = producer.__dict__["_mutation_pending"] = _Pending()
        return found

    def send(producer: Any, kwargs: dict[str, Any], resent: bool) -> int:
        pending = pending_of(producer)
        token = pending.next_token
        pending.next_token += 1
        user = kwargs.get("on_delivery")

        def acknowledged(err: Any, msg: Any) -> None:
            pending.records.pop(token, None)
            if user is not None:
                user(err, msg)

        if not resent:  # the copy is never re-sent again: one extra copy per record
            pending.records[token] = (time.monotonic(), kwargs)
        return produce(producer, **{**kwargs, "on_delivery": acknowledged})

    def resend_overdue(producer: Any) -> None:
        pending = pending_of(producer)
        now = time.monotonic()
        overdue = [t for t, (sent, _) in pending.records.items() if now - sent >= RESEND_AFTER_S]
        for token in overdue:
            _, kwargs = pending.records.pop(token)
            send(producer, kwargs, resent=True)

    def broken_produce(self: Any, topic: str, value: Any, **kwargs: Any) -> int:
        resend_overdue(self)
        return send(self, {"topic": topic, "value": value, **kwargs}, resent=False)

    def broken_poll(self: Any, timeout: float = 0.0) -> int:
        served: int = poll(self, timeout)
        resend_overdue(self)
        return served

    def broken_flush(self: Any, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = deadline and max(0.0, deadline - time.monotonic())
            step = RESEND_AFTER_S if left is None else min(RESEND_AFTER_S, left)
            in_flight: int = flush(self, step)
            resend_overdue(self)
            if in_flight == 0 and not pending_of(self).records:
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                return in_flight

    IdempotentProducer.produce = broken_produce  # type: ignore[method-assign,assignment]
    IdempotentProducer.poll = broken_poll  # type: ignore[method-assign]
    IdempotentProducer.flush = broken_flush  # type: ignore[method-assign]


def _lease_share_per_connection() -> None:
    from pidfence.pid_allocator.fair import Served, Turns

    def per_connection(self: Turns, connection: Served) -> str:
        return f"{connection.client}#{id(connection)}"

    Turns.key = per_connection  # type: ignore[method-assign]


def _copy_commit_without_bump() -> None:
    from pidfence.producer import IdempotentProducer

    def unchecked_bump(self: Any) -> Any:
        return self.checkpoint()

    IdempotentProducer.bump = unchecked_bump  # type: ignore[method-assign]


def _bump_without_fence() -> None:
    from pidfence.producer.driver import SessionDriver

    SessionDriver.announce = lambda self, bumped: None  # type: ignore[method-assign]


class _NoLock:
    """A lock that never waits: a queue whose token is always there."""

    def get(self) -> None:
        pass

    def get_nowait(self) -> None:
        pass

    def put(self, item: object) -> None:
        pass

    def put_nowait(self, item: object) -> None:
        pass


def _producer_without_lock() -> None:
    from pidfence.producer import lock

    lock.SimpleQueue = _NoLock  # type: ignore[attr-defined,assignment]


MUTATIONS: dict[str, Callable[[], None]] = {
    "resend-new-seq-on-timeout": _resend_new_seq_on_timeout,
    "lease-share-per-connection": _lease_share_per_connection,
    "copy-commit-without-bump": _copy_commit_without_bump,
    "bump-without-fence": _bump_without_fence,
    "producer-without-lock": _producer_without_lock,
}


def install_mutation(name: str) -> None:
    """Break this process's product as ``name`` says.

    Raises:
        UnknownMutation: no mutation has that name.
    """
    try:
        MUTATIONS[name]()
    except KeyError:
        raise UnknownMutation(
            f"unknown mutation {name!r}: use one of {', '.join(sorted(MUTATIONS))}"
        ) from None


# -- the lease authority's lineage (DESIGN.md §5 amended, round 4) ------------------------------
#
# Each breaks one rule of the lease servers' lineage, in the process that installs it (a
# ``pidfence lease-server`` started through ``python -m pidfence.testing.run --mutation NAME``,
# or a test). ``patch`` is how the broken piece is put in place: ``setattr`` for a process, a
# test's ``monkeypatch.setattr`` to undo it afterwards.
#
# * ``lineage-fresh-version``: a bump or roll decides on one read, then writes at the version of a
#   fresh read (a compare-and-set on the wrong version): two owners racing from one generation
#   can both win.
# * ``lineage-unversioned-set``: lineage records are set whatever their version (ZooKeeper's
#   version -1).
# * ``lineage-gc-before-refusal``: garbage collection deletes a lineage record at its own end plus
#   retention, while its block still answers for the pid (issue 40: a second successor).
# * ``lineage-non-owner-accepted``: any secret that names the pid's block is taken for its owner.
# * ``lineage-expired-bump``: a pid whose lease ended is bumped (it may only be rolled).
# * ``lineage-roll-leaves-pid-live``: a roll records the successor but leaves the rolled pid
#   unretired at its generation.

Patch = Callable[[Any, str, Any], None]


class LineageMutant(Protocol):
    """Installs a lineage mutant with ``patch`` (default ``setattr``)."""

    def __call__(self, patch: Patch = ...) -> None: ...


class _LineageStore:
    """A coordinator as a broken lease server would use it: every call passes through."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _FreshVersion(_LineageStore):
    def _fresh(self, pid: int) -> int | None:
        found = self._store.read_lineage(pid)
        return None if found is None else int(found[1])

    def write_lineage(self, pid: int, record: Any, version: int | None) -> None:
        self._store.write_lineage(pid, record, self._fresh(pid))

    def write_roll(self, roll: Any) -> None:
        self._store.write_roll(replace(roll, version=self._fresh(roll.pid)))


class _Unversioned(_LineageStore):
    def write_lineage(self, pid: int, record: Any, version: int | None) -> None:
        self._store.write_lineage(pid, record, None if version is None else -1)

    def write_roll(self, roll: Any) -> None:
        self._store.write_roll(replace(roll, version=None if roll.version is None else -1))


class _RollLeavesLive(_LineageStore):
    def write_roll(self, roll: Any) -> None:
        kept = replace(roll.record, successor=None, successor_generation=None)
        self._store.write_roll(replace(roll, record=kept))


def _lineage_store(wrapper: type[_LineageStore]) -> LineageMutant:
    def install(patch: Patch = setattr) -> None:
        from pidfence.pid_allocator.lineage import Lineage

        init = Lineage.__init__

        def broken_init(self: Any, store: Any, retention_ms: int) -> None:
            init(self, wrapper(store), retention_ms)

        patch(Lineage, "__init__", broken_init)

    return install


def _gc_before_refusal(patch: Patch = setattr) -> None:
    from pidfence.pid_allocator.coordinator import LineageRecord

    def own_retention_only(self: Any, block: Any, retention_ms: int) -> int:
        return int(self.expire_ms) + retention_ms

    patch(LineageRecord, "forgotten_at", own_retention_only)


def _non_owner_accepted(patch: Patch = setattr) -> None:
    from pidfence.pid_allocator import lineage, owners

    def anyone(secret: bytes, block_start: int, salt: bytes, pid: int) -> bool:
        return True

    patch(lineage, "secret_matches", anyone)
    patch(owners, "secret_matches", anyone)


def _expired_bump(patch: Patch = setattr) -> None:
    from pidfence.pid_allocator.lineage import Lineage

    patch(Lineage, "ended", staticmethod(lambda expire_ms, now_ms: False))


#: The lineage mutants: name -> install(patch=setattr).
LINEAGE_MUTATIONS: dict[str, LineageMutant] = {
    "lineage-fresh-version": _lineage_store(_FreshVersion),
    "lineage-unversioned-set": _lineage_store(_Unversioned),
    "lineage-gc-before-refusal": _gc_before_refusal,
    "lineage-non-owner-accepted": _non_owner_accepted,
    "lineage-expired-bump": _expired_bump,
    "lineage-roll-leaves-pid-live": _lineage_store(_RollLeavesLive),
}
MUTATIONS.update(LINEAGE_MUTATIONS)


# -- mutants of the exactly-once rules under gaps and adoption (issue 35) --------------------


def _forget_holes(patch: Patch = setattr) -> None:
    """``forget-holes``: gap resolution skips a gap and forgets it, so a record that fills the
    hole later (a resume re-sending what timed out) is called the DUPLICATE of nothing."""
    from pidfence.broker_plugin import holes

    patch(holes, "find", lambda entry, seq: -1)


MUTATIONS["forget-holes"] = _forget_holes


def _describe_end_plus_retention(patch: Patch = setattr) -> None:
    """``describe-end-plus-retention``: the lease servers' ``describe`` answers a lease's end
    plus the retention (when they forget the pid) as its end, so an ended lease looks live and a
    sink adopts the re-sends of a pid whose entry it already expired."""
    from dataclasses import replace as replaced

    from pidfence.pid_allocator.service import LeaseService
    from pidfence.wire import PidState, PidStatus

    real = LeaseService.describe

    async def lying(self: LeaseService, pid: int, client: str = "") -> PidStatus:
        found = await real(self, pid, client)
        if not found.known:
            return found
        end = found.expire_ms + self.settings.retention
        return replaced(found, state=PidState.LIVE, expire_ms=end)

    patch(LeaseService, "describe", lying)


MUTATIONS["describe-end-plus-retention"] = _describe_end_plus_retention
