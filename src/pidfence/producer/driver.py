"""``SessionDriver``: performs what the producer's session decides, with the I/O it needs.

The session (:mod:`~pidfence.producer.session`) decides; the driver performs, in the order the
session's states allow: the lease server's ``lease``, ``bump`` and ``roll`` (through
:class:`~pidfence.producer.lease.LeaseKeeper`), the drain before a roll, the FENCE records of a
resume and every record that is not stamped inline (through the
:class:`~pidfence.producer.sender.Sender`), and the recovery scan (a
:class:`~pidfence.producer.recovery.Scanner`, by default over Kafka).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict

from pidfence.ledger import Ledger
from pidfence.producer.blocking import may_block
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.delivery import DeliveryCallback, Skipped
from pidfence.producer.errors import (
    LeaseExpired,
    LeaseServerDown,
    ProducerConfigError,
    ProducerFenced,
    ReservedHeader,
    ValueTooLarge,
)
from pidfence.producer.headers import RESERVED_HEADERS, mac_headers
from pidfence.producer.kafka_scan import KafkaScanner, consumer_conf
from pidfence.producer.lease import How, LeaseKeeper
from pidfence.producer.partitioner import Partitioner
from pidfence.producer.recovery import CertVerifier, Scanner
from pidfence.producer.sender import ClientFactory, QueueFull, Sender
from pidfence.producer.sequencer import Sequencer
from pidfence.producer.session import ProducerSession
from pidfence.wire import PF_HEADER_KEY, KeyFileError
from pidfence.wire.statement import placed_check

log = logging.getLogger(__name__)

#: Stores a checkpoint together with the caller's current upstream position.
SaveCheckpoint = Callable[[ProducerCheckpoint], None]
#: Extra headers of a record, as ``produce`` takes them.
Headers = Sequence[tuple[str, bytes | str | None]]
#: How long a bump waits for its FENCE records' acknowledgements.
BUMP_FENCE_TIMEOUT_S = 60.0


class ProducerOptions(TypedDict, total=False):
    """The keyword options ``IdempotentProducer`` and its ``resume`` both take."""

    ledger: str | Path | Ledger | None
    clock: Callable[[], int]
    producer_factory: ClientFactory
    on_roll: SaveCheckpoint | None


class SessionDriver:
    """Leases, resumes and rolls one producer's session and sends its general-path records.

    Args:
        config: the producer settings.
        session: the session it drives.
        keeper: the lease-server calls.
        sender: the Kafka client (records, drains, FENCE records, the fences' offsets).
        clock: epoch milliseconds.
        on_roll: gives what stores the successor's checkpoint after a rollover a record starts.
    """

    def __init__(
        self,
        config: ProducerConfig,
        session: ProducerSession,
        keeper: LeaseKeeper,
        sender: Sender,
        clock: Callable[[], int],
        on_roll: Callable[[], SaveCheckpoint | None] = lambda: None,
    ) -> None:
        self._config = config
        self._session = session
        self._keeper = keeper
        self._sender = sender
        #: Partition counts (metadata cached per topic) and each record's partition.
        self.partitioner = Partitioner(
            sender.client.list_topics,
            config.bootstrap_servers,
            config.metadata_timeout_s,
            config.sticky_records,
        )
        self._count = self.partitioner.count
        self._clock = clock
        self._max_value = config.message_max_bytes
        self._on_roll = on_roll

    def lease_new(self) -> None:
        """Lease a fresh pid.

        Raises:
            LeaseServerDown: no lease server answered (``ZooKeeperUnavailable``: one answered
                but cannot reach ZooKeeper).
        """
        sequencer = self._keeper.lease_new()
        self.partitioner.seed = sequencer.pid
        self._session.leased(sequencer)

    def resume(
        self,
        checkpoint: ProducerCheckpoint,
        *,
        stale_probe: int,
        topics: Sequence[str],
        partitions: Sequence[TopicPartition] | None,
        fence_timeout_s: float,
        scanner: Scanner | None,
        scan_verifier: CertVerifier | None,
    ) -> How:
        """Continue ``checkpoint`` through its lineage, FENCE, run the recovery scan; returns
        how it continued (see :meth:`pidfence.producer.IdempotentProducer.resume`)."""
        session = self._session
        try:
            resumed = self._keeper.resume(checkpoint, stale_probe)
        except ProducerFenced:
            session.refused()
            raise
        # The first run's sticky choices, whatever pid continues: the replay picks as it did.
        self.partitioner.restore(checkpoint.sticky, checkpoint.sticky_seed or checkpoint.pid)
        names = session.resumed(resumed, checkpoint, topics)
        parts = (
            [(t, p) for t in names for p in range(self._count(t))]
            if partitions is None
            else list(partitions)
        )
        if resumed.walk_from is not None:
            self._sender.send_fences(session.fences(resumed.walk_from, parts), fence_timeout_s)
        # No partitions: the checkpoint's pid wrote nothing, so there is nothing to find.
        if session.scan_needed(checkpoint) and parts:
            verifier = scan_verifier or self._scan_verifier()
            state, since_ms = session.scan_state(checkpoint, verifier)
            if scanner is None:
                scanner = KafkaScanner(consumer_conf(self._config.to_librdkafka()))
            scanner(state, parts, since_ms, dict(self._sender.delivery.fence_ends))
            session.scanned(checkpoint, state.highs, state.holes)
        current = session.sequencer
        log.info(
            "resumed the checkpoint of pid %d (%s): pid %d at generation %d",
            checkpoint.pid,
            resumed.how,
            current.pid,
            current.generation,
        )
        return resumed.how

    def _scan_verifier(self) -> CertVerifier | None:
        keys = self._config.lease_public_keys
        if not keys:
            return None
        try:
            return placed_check(keys).for_partition
        except KeyFileError as exc:
            raise ProducerConfigError(f"lease_public_keys: {exc}") from None

    def stored(
        self, checkpoint: ProducerCheckpoint, unpicked: str | None = None
    ) -> ProducerCheckpoint:
        """``checkpoint`` with the partitioner's sticky positions and seed (see
        :meth:`Partitioner.sticky_state` for ``unpicked``)."""
        seed = self.partitioner.seed
        return dataclasses.replace(
            checkpoint,
            sticky=self.partitioner.sticky_state(unpicked),
            sticky_seed=0 if seed == checkpoint.pid else seed,
        )

    def checkpoint(self, confirm: bool) -> ProducerCheckpoint:
        """The checkpoint to store now (:meth:`pidfence.producer.IdempotentProducer.checkpoint`):
        nothing in flight, no record failed, and (``confirm``) no other owner moved the pid on."""
        self._sender.require_idle()
        session = self._session
        current = session.current()
        if confirm:
            try:
                self._keeper.confirm(current)
            except ProducerFenced:
                session.refused()
                raise
        return self.stored(session.checkpoint(self._clock()))

    def bump(self) -> ProducerCheckpoint:
        """Bump the live pid's generation, then FENCE its partitions at the new one
        (:meth:`pidfence.producer.IdempotentProducer.bump`)."""
        self._sender.require_idle()
        session = self._session
        try:
            bumped = self._keeper.bump(session.current())
        except ProducerFenced:
            session.refused()
            raise
        session.bumped(bumped, self._clock())
        self.announce(bumped)
        return self.stored(session.checkpoint(self._clock()))

    def announce(self, bumped: Sequencer) -> None:
        """FENCE every partition ``bumped`` wrote or fenced at its generation, acknowledged
        before any data. The rules move ``gE`` one generation at a time and only on records
        that land: data re-sent under a generation may all be ``DUPLICATE``, and the data of the
        next one would then be ``INVALID_GENERATION``; a FENCE always lands."""
        fences = self._session.fences(bumped.generation, bumped.fenced)
        self._sender.send_fences(fences, BUMP_FENCE_TIMEOUT_S)

    def roll(self, save: SaveCheckpoint | None, unpicked: str | None = None) -> ProducerCheckpoint:
        """Drain, roll through the lease server, hand over, then ``save`` the successor's
        checkpoint (see :meth:`pidfence.producer.IdempotentProducer.roll`); ``unpicked``: the
        topic of a record whose sticky pick came before the roll (:meth:`stored`)."""
        self._sender.require_unfailed()  # the successor's checkpoint would cover the record
        session = self._session
        current = session.begin_roll()
        try:
            left = self._sender.flush(session.drain_budget_s(self._clock()))
        except BaseException:
            session.drain_aborted()
            raise
        session.drained(left)
        try:
            successor = self._keeper.roll(current)
        except ProducerFenced:
            session.roll_refused()
            raise
        except LeaseServerDown as exc:
            session.roll_unanswered(exc, self._clock())
            raise
        except LeaseExpired:
            session.roll_lapsed()
            raise
        checkpoint = self.stored(session.rolled(successor, self._clock()), unpicked)
        if save is not None:
            save(checkpoint)
        return checkpoint

    def sendable(self, unpicked: str | None = None) -> Sequencer:
        """The sequencer to send with now: rolls over first when due (``on_roll()`` stores the
        successor's checkpoint; ``unpicked``: see :meth:`roll`); raises if nothing may be sent.

        Raises:
            DrainFailed / ProducerFenced / LeaseExpired / DeliveryFailed: see :meth:`roll`.
        """
        session = self._session
        if session.rollover_due(self._clock()):
            may_block()  # the drain and the lease call wait
            try:
                self.roll(self._on_roll(), unpicked)
            except LeaseServerDown as exc:
                # roll() raised LeaseExpired instead if the lease had ended; here it is live.
                pid = session.sequencer.pid
                log.warning("rollover of pid %d failed (%s); retrying later", pid, exc)
        return session.sendable(self._clock())

    def one(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None,
        partition: int | None,
        headers: Headers | None,
        on_delivery: DeliveryCallback | None,
        event_id: str | None,
        sticky: bool = False,
    ) -> int:
        """One record the general way: roll when due, convert and check, ask the session for
        its headers (or a skip), hand it over with its callback; returns its partition.

        ``sticky``: ``partition`` is this unkeyed record's sticky pick, made before a rollover
        this call may do (its checkpoint must come before that pick). Call it holding the
        producer's lock. ``QueueFull``: the record's seq was given back; wait for room outside
        the lock, then call it again for ``QueueFull.partition``."""
        seq = self.sendable(topic if sticky and partition is not None else None)
        value_b = value.encode() if isinstance(value, str) else value
        key_b = key.encode() if isinstance(key, str) else key
        user = _user_headers(headers)
        size = len(value_b or b"") + len(key_b or b"") + sum(n for _, _, n in user)
        if size > self._max_value:
            raise ValueTooLarge(
                f"record of {size} bytes (key, value and headers) exceeds message_max_bytes="
                f"{self._max_value}; split the record or raise the limit (producer and topic "
                "max.message.bytes)"
            )
        if partition is None:
            partition = self.partitioner.pick(topic, key_b, seq.pid)
        self.partitioner.check(topic, partition)
        session = self._session
        now_ms = self._clock()
        stamped = session.stamp(topic, partition, now_ms)
        if stamped is None:
            # Already in Kafka under the predecessor pid (recovery scan): delivered.
            if on_delivery is not None:
                self._sender.report_skipped(on_delivery, Skipped(topic, partition, key_b, value_b))
            return partition
        pf, extras = stamped
        if seq.mac_key is not None:
            extras += mac_headers(
                seq, topic, partition, seq.peek(topic, partition) - 1, 0, key_b, value_b
            )
        wire: list[tuple[str, bytes | str | None]] = [(PF_HEADER_KEY, pf), *extras]
        wire.extend((name, header) for name, header, _ in user)
        try:
            callback = self._sender.callback(pf, event_id, on_delivery)
            self._sender.hand_over(topic, value_b, key_b, partition, wire, callback)
        except BufferError:
            session.unstamp(topic, partition, extras)
            raise QueueFull(partition) from None
        except BaseException:
            session.unstamp(topic, partition, extras)
            raise
        session.sent(topic, partition, now_ms)
        return partition


def _user_headers(headers: Headers | None) -> list[tuple[str, bytes | str | None, int]]:
    """The caller's headers with their sizes in bytes (name and value, as Kafka counts them).

    Raises:
        ReservedHeader: one is named ``pf``, ``pfc`` or ``pfm``.
    """
    out = []
    for name, header in headers or ():
        if name in RESERVED_HEADERS:
            raise ReservedHeader(
                f"the header name {name!r} is reserved for the producer's own headers; "
                "rename your header"
            )
        value = header.encode() if isinstance(header, str) else header or b""
        out.append((name, header, len(name.encode()) + len(value)))
    return out
