"""The producer's side of the lease protocol: lease, resume through the lineage, roll over.

DESIGN §9: a pid's successor is issued only by ``roll``, a compare-and-set on the pid's current
generation, so every continuation of a checkpoint goes through one chain of (pid, generation)
that the lease server serialises. :class:`LeaseKeeper` turns lease-server replies into
:class:`~pidfence.producer.sequencer.Sequencer` objects and decides, for ``resume``, which of
the four ways a checkpoint continues:

* ``bumped``: the pid is live; bump it (fences the old owner), keep the checkpoint's seqs.
* ``rolled``: the pid's lease ended; roll it into its successor (seqs from 0).
* ``followed``: the pid was already rolled (by its owner after this checkpoint, or by another
  resumer of it); bump the successor with this pid's secret (lineage authority), which fences
  whoever holds it, and continue the successor from seq 0. The recovery scan
  (:mod:`~pidfence.producer.recovery`) then skips what the pid got into Kafka after the
  checkpoint, so the successor's seqs line up with what its earlier holder sent.
* ``fresh``: the server no longer knows the pid (past the lineage retention): a new pid.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.pid_allocator.errors import (
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    NotOwner,
    RateLimited,
    StaleGeneration,
    UnknownOp,
    UnknownPid,
)
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.errors import (
    LeaseExpired,
    LeaseServerDown,
    ProducerError,
    ProducerFenced,
    ZooKeeperUnavailable,
)
from pidfence.producer.sequencer import Sequencer
from pidfence.wire import PidState, PidStatus
from pidfence.wire.cert import cert_producer_key

log = logging.getLogger(__name__)

How = Literal["bumped", "rolled", "followed", "fresh"]


class LeaseClientLike(Protocol):
    """What the producer needs from :class:`pidfence.pid_allocator.LeaseClient`."""

    def lease(self, partitions: Sequence[tuple[str, int]] = (), *, key: bytes | None = None) -> Any:
        """Lease a new pid (pid, generation, sequence, expire_ms, secret, cert, mac_key);
        ``key``: the producer's public key for the cert to name."""

    def bump(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Any:
        """Bump ``pid`` from ``generation``."""

    def roll(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Any:
        """Retire ``pid`` at ``generation`` and return its successor's lease."""

    def describe(self, pid: int) -> PidStatus:
        """What the lease authority knows of ``pid`` (read-only). A stand-in without it cannot
        confirm ownership: ``checkpoint()`` then trusts it (:meth:`LeaseKeeper.confirm`)."""


@dataclass(frozen=True, slots=True)
class Resumed:
    """How a checkpoint continues: the sequencer to send with and the FENCE walk to write.

    Attributes:
        sequencer: pid, generation, secret, cert and the seqs to continue from.
        walk_from: FENCE every partition from this generation up to the sequencer's (None: no
            FENCE is needed, the pid is new).
        how: ``bumped``, ``rolled``, ``followed`` or ``fresh`` (see the module docstring).
        followed: the checkpoint's pid's successor when the resume found its lease ended and
            rolled it in turn (its records after the checkpoint are in Kafka too), else None.
    """

    sequencer: Sequencer
    walk_from: int | None
    how: How
    followed: int | None = None


@dataclass(frozen=True, slots=True)
class _Probe:
    outcome: Literal["ok", "retired", "ended", "not_owner", "stale"]
    lease: Any = None
    error: Exception | None = None


class LeaseKeeper:
    """Calls the lease server for the producer and maps its errors to producer errors.

    Every call names this producer's own Ed25519 key (made here, never stored): a signing lease
    server certifies it in the lease's cert (version 2), and the session signs placed statements
    with it (DESIGN §3 amended again).

    Args:
        client: a :class:`pidfence.pid_allocator.LeaseClient` (or a fake).
        clock: epoch milliseconds.
    """

    def __init__(self, client: LeaseClientLike, clock: Callable[[], int]) -> None:
        self._client = client
        self._clock = clock
        self._signer = Ed25519PrivateKey.generate()
        self._key = self._signer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def _keyed(self, seq: Sequencer, lease: Any) -> Sequencer:
        """``seq`` with this producer's signer when its cert names our key, and the MAC key."""
        if cert_producer_key(seq.cert) == self._key:
            seq.signer = self._signer
        seq.mac_key = getattr(lease, "mac_key", None)
        seq.prior_mac_key = getattr(lease, "prior_mac_key", None)
        return seq

    def _call(self, call: Callable[[], Any]) -> Any:
        # Each message names the component that failed and says the fix once (issue 24).
        try:
            return call()
        except LeaseServiceUnavailable as exc:
            raise ZooKeeperUnavailable(
                f"the lease server answered UNAVAILABLE: it cannot reach ZooKeeper ({exc}); "
                "check that the ZooKeeper ensemble it was started with (`pidfence lease-server "
                "--zk`) runs and is reachable from the lease server, then retry"
            ) from exc
        except RateLimited as exc:
            raise LeaseServerDown(
                f"the lease server is rate limiting this client ({exc}); retry shortly"
            ) from exc
        except LeaseServerUnreachable as exc:
            # The client's message already names the servers it tried and how to start one.
            raise LeaseServerDown(str(exc)) from exc

    def _sequencer(self, lease: Any, next_seq: Any = None, lifetime_ms: int = 0) -> Sequencer:
        lifetime = lifetime_ms or max(lease.expire_ms - self._clock(), 1)
        seq = Sequencer(
            lease.pid,
            lease.generation,
            lease.expire_ms,
            next_seq,
            lifetime,
            getattr(lease, "secret", b"") or b"",
            getattr(lease, "cert", None),
        )
        return self._keyed(seq, lease)

    def lease_new(self) -> Sequencer:
        """A fresh pid.

        Raises:
            LeaseServerDown: no lease server answered (retriable).
        """
        return self._sequencer(self._call(lambda: self._client.lease((), key=self._key)))

    def roll(self, current: Sequencer) -> Sequencer:
        """Roll ``current`` into its successor (compare-and-set on its generation).

        Raises:
            ProducerFenced: the pid was bumped or rolled by another owner (or its reply was
                lost and the retry found it retired: the safe side; resume from the checkpoint).
            LeaseServerDown: no lease server answered (retriable; nothing changed, or a lost
                reply, which the next attempt reports as fenced).
        """
        try:
            lease = self._move(self._client.roll, current, "roll over")
        except ProducerFenced as fenced:
            cause = fenced.__cause__
            if isinstance(cause, NotOwner | UnknownPid) and current.expire_ms <= self._clock():
                # The server forgot the pid: its lease ended more than the lineage retention
                # ago. Nothing proves another owner, nor that there is none: a fresh pid could
                # not be fenced by a replacement that resumed this producer's checkpoint, and
                # the sink would take its records as a new producer's (duplicates). A rerun
                # resumes the stored checkpoint through the lineage instead.
                raise LeaseExpired(
                    f"the lease of pid {current.pid} ended at {current.expire_ms}, longer ago "
                    f"than the lease servers keep a pid ({type(cause).__name__}: {cause}), so "
                    "it cannot be rolled over (the producer sent nothing for over a lease "
                    "lifetime); nothing was sent under it since it ended. Rerun: resume from the "
                    "last stored checkpoint"
                ) from cause
            raise
        return self._sequencer(lease, lifetime_ms=current.lifetime_ms)

    def confirm(self, current: Sequencer) -> None:
        """Raise ``ProducerFenced`` when the lease authority shows that another owner moved
        ``current``'s pid on: a newer generation, or the pid rolled (retired) at this
        generation or later, by a resume of its checkpoint.

        Called when nothing is in flight: every record a checkpoint covers is acknowledged
        before this question, so if no newer generation exists now, any later bump's FENCE
        lands after them in every partition and the sink appends them. An ``unknown`` answer
        (never bumped or rolled, or past retention) proves no fencing and is accepted, as is a
        lease client without ``describe``.

        Raises:
            ProducerFenced: another owner moved the pid on; this instance must stop.
            LeaseServerDown: no lease server answered (retriable; nothing was confirmed).
        """
        describe = getattr(self._client, "describe", None)
        if describe is None:
            return
        try:
            status: PidStatus = self._call(lambda: describe(current.pid))
        except UnknownOp as exc:
            raise ProducerError(
                f"the lease server does not answer describe ({exc}): it is older than this "
                "producer, which asks it at every checkpoint whether this instance was "
                "replaced; upgrade the lease servers"
            ) from exc
        if not status.known:
            return
        newer = status.generation > current.generation
        rolled = status.state is PidState.RETIRED and status.generation >= current.generation
        if newer or rolled:
            how = (
                "rolled it into a successor" if rolled else f"holds generation {status.generation}"
            )
            raise ProducerFenced(
                f"pid {current.pid} generation {current.generation} was replaced: another "
                f"instance resumed this producer's checkpoint and {how}; this instance must stop "
                "and store nothing (its records since then may be FENCED)"
            )

    def bump(self, current: Sequencer) -> Sequencer:
        """Bump ``current`` to a new generation of its pid (compare-and-set on its own), with
        its seqs, skips and topics.

        Raises:
            ProducerFenced: another owner bumped or rolled the pid since, or its lease ended.
            LeaseServerDown: no lease server answered (retriable; nothing changed).
        """
        lease = self._move(self._client.bump, current, "be bumped")
        seq = self._bumped(current.checkpoint(), lease)
        seq.fenced = dict(current.fenced)
        return seq

    def _bumped(self, cp: ProducerCheckpoint, lease: Any) -> Sequencer:
        """``cp``'s sequencer (its pid, seqs, skips and topics) at ``lease``'s generation."""
        seq = Sequencer.resumed(
            cp,
            lease.generation,
            lease.expire_ms,
            getattr(lease, "secret", b"") or cp.secret,
            getattr(lease, "cert", None),
        )
        return self._keyed(seq, lease)

    def _move(self, op: Callable[..., Any], current: Sequencer, verb: str) -> Any:
        """``op`` (the client's bump or roll) on ``current``; an owner's refusal is fencing."""
        try:
            return self._call(
                lambda: op(current.pid, current.generation, current.secret, key=self._key)
            )
        except (StaleGeneration, NotOwner, UnknownPid) as exc:
            raise ProducerFenced(
                f"pid {current.pid} generation {current.generation} could not {verb} "
                f"({type(exc).__name__}: {exc}): another owner moved it on; stop this instance"
            ) from exc

    def _probe(
        self,
        op: Callable[..., Any],
        pid: int,
        generation: int,
        secret: bytes,
        probe: int,
    ) -> _Probe:
        last: Exception | None = None
        for step in range(probe + 1):
            try:
                lease = self._call(
                    functools.partial(op, pid, generation + step, secret, key=self._key)
                )
                return _Probe("ok", lease)
            except StaleGeneration as exc:
                if exc.successor is not None:
                    return _Probe("retired", error=exc)
                last = exc
            except UnknownPid as exc:
                return _Probe("ended", error=exc)
            except NotOwner as exc:
                return _Probe("not_owner", error=exc)
        return _Probe("stale", error=last)

    def resume(self, cp: ProducerCheckpoint, probe: int) -> Resumed:
        """Continue ``cp`` through the lineage (see the module docstring).

        ``probe``: a process killed between its bump and saving the next checkpoint leaves the
        server ahead of the stored generation; the next ``probe`` generations are tried.

        Raises:
            ProducerFenced: another owner holds the checkpoint's lineage (or the checkpoint is
                stale: its pid was rolled over after it was taken).
            LeaseServerDown: no lease server answered (retriable).
        """
        expired = cp.expire_ms <= self._clock()
        result = _Probe("ended")
        if not expired:
            result = self._probe(self._client.bump, cp.pid, cp.generation, cp.secret, probe)
            if result.outcome == "ok":
                return Resumed(self._bumped(cp, result.lease), cp.generation + 1, "bumped")
        if result.outcome == "ended":
            expired = True
            result = self._probe(self._client.roll, cp.pid, cp.generation, cp.secret, probe)
            if result.outcome == "ok":
                return Resumed(
                    self._sequencer(result.lease, lifetime_ms=cp.lifetime_ms), None, "rolled"
                )
        if result.outcome == "retired" and isinstance(result.error, StaleGeneration):
            return self._follow(cp, result.error, probe)
        if result.outcome in ("not_owner", "ended") and expired:
            log.warning(
                "checkpoint of pid %d expired at %d and the lease server no longer knows it "
                "(past the lineage retention): continuing under a new pid with seqs from 0; "
                "records re-sent after the checkpoint cannot be deduplicated",
                cp.pid,
                cp.expire_ms,
            )
            return Resumed(self.lease_new(), None, "fresh")
        raise self._fenced(cp, result)

    def _follow(self, cp: ProducerCheckpoint, stale: StaleGeneration, probe: int) -> Resumed:
        successor, start = stale.successor, stale.successor_generation
        if successor is None or start is None:
            raise ProducerFenced(f"pid {cp.pid} was retired without a usable successor ({stale})")
        result = self._probe(self._client.bump, successor, start, cp.secret, probe)
        if result.outcome == "ok":
            seq = self._sequencer(result.lease, lifetime_ms=cp.lifetime_ms)
            log.info("checkpoint of pid %d continues its successor pid %d", cp.pid, successor)
            return Resumed(seq, start + 1, "followed")
        if result.outcome == "ended":
            result = self._probe(self._client.roll, successor, start, cp.secret, probe)
            if result.outcome == "ok":
                seq = self._sequencer(result.lease, lifetime_ms=cp.lifetime_ms)
                return Resumed(seq, None, "rolled", successor)
        raise self._fenced(cp, result)

    @staticmethod
    def _fenced(cp: ProducerCheckpoint, result: _Probe) -> ProducerFenced:
        reason = {
            "stale": "none of the probed generations is the latest, so another producer owns it",
            "retired": "its lineage moved on more than one roll",
            "not_owner": "the lease server does not accept this checkpoint's secret",
            "ended": "its lease ended",
            "ok": "",
        }[result.outcome]
        error = ProducerFenced(
            f"checkpoint of pid {cp.pid} generation {cp.generation} cannot continue: {reason}; "
            "stop this instance (or resume from the newer checkpoint)"
        )
        error.__cause__ = result.error
        return error
