"""``Sequencer``: the producer's sequencing logic with no I/O.

It owns one (pid, generation) and the next seq per (topic, partition); it stamps ``pf`` headers,
produces the FENCE headers a resumed producer writes first, and the checkpoint data. The
producer's session (:mod:`~pidfence.producer.session`) holds it and decides when it stamps and
what else a record carries. Not thread-safe: one producer thread calls it.

Example::

    seq = Sequencer(pid=7, generation=3, expire_ms=now + day)
    header = seq.stamp("t", 0)            # pf for (7, 3, seq 0); the next stamp on t/0 uses 1
    fences = seq.fences()                 # [(topic, partition, pf FENCE header), ...]
    cp = seq.checkpoint()                 # ProducerCheckpoint(7, 3, expire, {("t", 0): 1})
    nxt = Sequencer.resumed(cp, generation=4, expire_ms=cp.expire_ms)  # after a bump
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.wire import (
    FLAG_FENCE,
    GENERATION_LIMIT,
    PF_HEADER_KEY,
    PF_VERSION,
    PID_LIMIT,
    SEQ_LIMIT,
    encode_pf,
)
from pidfence.wire.mac import MAC_HEADER_KEY, record_hasher, record_mac_from

#: Packs a seq in [0, 65536) as two big-endian bytes plus the flags byte 0 (``0xcd`` form).
U16X = struct.Struct(">Hx").pack
_U32X = struct.Struct(">Ix").pack
_U64X = struct.Struct(">Qx").pack


@dataclass(slots=True, eq=False, repr=False)
class Sequencer:
    """Per-partition sequence counters for one (pid, generation).

    Args:
        pid: the leased producer id (``1 <= pid < 2**63``).
        generation: fencing token from the lease server.
        expire_ms: lease end, epoch milliseconds.
        next_seq: next seq per (topic, partition) to continue from (a checkpoint's), else empty.
        lifetime_ms: the lease lifetime if known (0: unknown), carried into checkpoints.
        secret: the pid's capability (carried into checkpoints).
        cert: the lease server's signed cert of (pid, generation, expire_ms), or None; the
            session stamps it as ``pfc`` (``certified`` holds the partitions that carried it).
    """

    pid: int
    generation: int
    expire_ms: int
    next_seq: InitVar[Mapping[TopicPartition, int] | None] = None
    lifetime_ms: int = 0
    secret: bytes = b""
    cert: bytes | None = None
    #: The producer key a version 2 ``cert`` names (the session signs placed statements with
    #: it), or None: the cert is stamped bare.
    signer: Ed25519PrivateKey | None = field(init=False, default=None)
    _mac_key: bytes | None = field(init=False, default=None)
    #: The keyed hash state of :attr:`mac_key` (copied per record), or None.
    mac_hasher: hashlib.blake2b | None = field(init=False, default=None)
    #: After a roll, the rolled pid's MAC key (its records are scanned on a resume).
    prior_mac_key: bytes | None = field(init=False, default=None)
    #: Partitions a resume FENCEd, with that FENCE's generation (see the checkpoint's).
    fenced: dict[TopicPartition, int] = field(init=False, default_factory=dict)
    certified: set[TopicPartition] = field(init=False, default_factory=set)
    #: Records per partition not to send: already in Kafka under the predecessor pid.
    skip: dict[TopicPartition, int] = field(init=False, default_factory=dict)
    #: Per partition, the records of the ``skip`` run sent after all, as ``(first, last)``
    #: positions counted back from the run's end (``skip`` counts down through them), in the
    #: order they come: the predecessor's seqs the sink skipped as a gap (a timeout hole), so
    #: nothing of theirs is in the output.
    resend: dict[TopicPartition, list[tuple[int, int]]] = field(init=False, default_factory=dict)
    #: Per partition, the next seq after the highest one an earlier instance of this pid got
    #: into Kafka (recovery scan): below it, re-sent records are DUPLICATEs.
    ahead: dict[TopicPartition, int] = field(init=False, default_factory=dict)
    #: Per partition, the seqs below ``ahead`` the sink skipped as a gap, ``(first, last)``
    #: ascending: re-sent, they fill it; handed over to a successor, they are sent, not skipped.
    ahead_holes: dict[TopicPartition, list[tuple[int, int]]] = field(
        init=False, default_factory=dict
    )
    #: Topics written under this lineage before this sequencer (carried over rollovers).
    topics: set[str] = field(init=False, default_factory=set)
    #: Per topic, per partition: a one-element list holding the next seq (a mutable cell, so
    #: the producer's fast path advances it without building a (topic, partition) key).
    _lanes: dict[str, dict[int, list[int]]] = field(init=False, default_factory=dict)
    #: The cells of partitions whose next record needs no skip and no extra header: the
    #: producer's stamping loop stamps those inline (see :meth:`mark_ready`, :meth:`header`).
    ready: dict[str, dict[int, list[int]]] = field(init=False, default_factory=dict)
    #: The complete headers of seqs 0..255 (msgpack positive fixints below 128, then the
    #: ``0xcc`` uint8 form).
    fixed: tuple[bytes, ...] = field(init=False)
    #: ``prefix + 0xcd``: the header of a seq in [256, 65536) is this plus ``U16X(seq)``.
    prefix16: bytes = field(init=False)
    _prefix32: bytes = field(init=False)
    _prefix64: bytes = field(init=False)

    def __post_init__(self, next_seq: Mapping[TopicPartition, int] | None) -> None:
        pid, generation = self.pid, self.generation
        if type(pid) is not int or not 1 <= pid < PID_LIMIT:
            raise ValueError(f"pid must be an int in [1, 2**63), got {pid!r}")
        if type(generation) is not int or not 0 <= generation < GENERATION_LIMIT:
            raise ValueError(f"generation must be an int in [0, 2**31), got {generation!r}")
        for (topic, partition), n in (next_seq or {}).items():
            self._lanes.setdefault(topic, {})[partition] = [n]
        # [version, pid, generation, seq, flags] as msgpack: everything before seq is fixed for
        # this sequencer, so a header is a prefix plus the packed seq plus the flags byte.
        packer = msgpack.Packer()
        prefix = b"\x95" + b"".join(map(packer.pack, (PF_VERSION, pid, generation)))
        self.fixed = tuple(prefix + bytes((n, 0)) for n in range(128)) + tuple(
            prefix + bytes((0xCC, n, 0)) for n in range(128, 256)
        )
        self.prefix16 = prefix + b"\xcd"
        self._prefix32 = prefix + b"\xce"
        self._prefix64 = prefix + b"\xcf"

    @property
    def mac_key(self) -> bytes | None:
        """The lease's per-record MAC key (the lease server's ``--record-mac-secret``), or None."""
        return self._mac_key

    @mac_key.setter
    def mac_key(self, key: bytes | None) -> None:
        self._mac_key = key
        self.mac_hasher = None if key is None else record_hasher(key)

    def with_mac(
        self,
        topic: str,
        partition: int,
        seq: int,
        pf: bytes,
        key: bytes | None,
        value: bytes | None,
    ) -> list[tuple[str, bytes]]:
        """The headers of data record ``seq`` in the per-record mode: ``pf`` and its ``pfm``
        (call it only when :attr:`mac_hasher` is set)."""
        hasher: hashlib.blake2b = self.mac_hasher  # type: ignore[assignment]
        mac = record_mac_from(
            hasher, topic, partition, self.pid, self.generation, seq, 0, key, value
        )
        return [(PF_HEADER_KEY, pf), (MAC_HEADER_KEY, mac)]

    @classmethod
    def resumed(
        cls,
        checkpoint: ProducerCheckpoint,
        generation: int,
        expire_ms: int,
        secret: bytes | None = None,
        cert: bytes | None = None,
    ) -> Sequencer:
        """A sequencer continuing ``checkpoint`` under the bumped ``generation``."""
        seq = cls(
            checkpoint.pid,
            generation,
            expire_ms,
            checkpoint.next_seq,
            checkpoint.lifetime_ms,
            checkpoint.secret if secret is None else secret,
            cert,
        ).with_skip(checkpoint.skip, checkpoint.resend)
        seq.ahead = dict(checkpoint.ahead)
        seq.ahead_holes = {tp: list(holes) for tp, holes in checkpoint.ahead_holes.items()}
        seq.topics = set(checkpoint.topics)
        return seq

    def with_skip(
        self,
        skip: Mapping[TopicPartition, int],
        resend: Mapping[TopicPartition, Sequence[tuple[int, int]]] | None = None,
    ) -> Sequencer:
        """This sequencer with a run of ``skip`` records appended to each partition's skips,
        ``resend`` the positions of that run sent after all (see :attr:`resend`); returns self."""
        for tp, n in skip.items():
            if n <= 0:
                continue
            earlier = [(a + n, b + n) for a, b in self.resend.get(tp, ())]
            added = [(a, b) for a, b in (resend or {}).get(tp, ()) if 1 <= b <= a <= n]
            if earlier or added:
                self.resend[tp] = earlier + added
            self.skip[tp] = self.skip.get(tp, 0) + n
            self.unready(*tp)
        return self

    def skips_next(self, topic: str, partition: int) -> bool:
        """Whether the next record of (topic, partition) is skipped (nothing is consumed: a
        :attr:`resend` position is taken by :meth:`take_skip` once its record is handed over)."""
        tp = (topic, partition)
        n = self.skip.get(tp, 0)
        if n <= 0:
            return False
        sends = self.resend.get(tp)
        return not sends or not sends[0][1] <= n <= sends[0][0]

    def take_skip(self, topic: str, partition: int) -> bool:
        """Take the next position of (topic, partition)'s skip run: True when its record is
        skipped, False for a :attr:`resend` position (or no run at all)."""
        tp = (topic, partition)
        n = self.skip.get(tp, 0)
        if n <= 0:
            return False
        if n == 1:
            del self.skip[tp]
        else:
            self.skip[tp] = n - 1
        sends = self.resend.get(tp)
        if not sends:
            return True
        first, last = sends[0]
        sent = last <= n <= first
        if n == last:
            sends.pop(0)
        elif sent:
            sends[0] = (n - 1, last)  # position n is taken: the range goes on below it
        if n == 1 or not sends:
            self.resend.pop(tp, None)
        return not sent

    def header(self, seq: int) -> bytes:
        """The ``pf`` header of the data record with ``seq`` (byte for byte ``encode_pf``).

        Raises:
            OverflowError: ``seq`` reached ``2**63``.
        """
        if seq < 0x100:
            return self.fixed[seq]
        # msgpack's smallest unsigned form, as msgpack.packb writes it (a unit test checks it).
        if seq < 0x10000:
            return self.prefix16 + U16X(seq)
        if seq < 0x1_0000_0000:
            return self._prefix32 + _U32X(seq)
        if seq >= SEQ_LIMIT:
            raise OverflowError(f"seq {seq} reached 2**63; lease a new pid")
        return self._prefix64 + _U64X(seq)

    def stamp(self, topic: str, partition: int) -> bytes:
        """The ``pf`` header for the next data record on (topic, partition); advances its seq."""
        lanes = self._lanes.get(topic)
        if lanes is None:
            lanes = self._lanes[topic] = {}
        cell = lanes.get(partition)
        if cell is None:
            cell = lanes[partition] = [0]
        seq = cell[0]
        header = self.header(seq)
        cell[0] = seq + 1
        return header

    def rewind(self, topic: str, partition: int) -> None:
        """Undo the last :meth:`stamp` on (topic, partition): its record was never handed over."""
        cell = self._lanes[topic][partition]  # KeyError: never stamped
        if cell[0] <= 0:
            raise ValueError(f"nothing to rewind on {(topic, partition)}")
        cell[0] -= 1

    def peek(self, topic: str, partition: int) -> int:
        """The seq the next :meth:`stamp` on (topic, partition) will use."""
        cell = self._lanes.get(topic, {}).get(partition)
        return 0 if cell is None else cell[0]

    def mark_ready(self, topic: str, partition: int) -> None:
        """Let the producer's stamping loop stamp (topic, partition) inline through
        :attr:`ready` (the session calls it when the partition's next record needs no skip and
        no extra header).

        The inline stamp must do exactly what :meth:`stamp` does: ``cell[0]`` is the seq,
        :meth:`header` (``fixed[seq]`` below 256) the header, then ``cell[0] += 1``.
        """
        cell = self._lanes.get(topic, {}).get(partition)
        if cell is not None:
            self.ready.setdefault(topic, {})[partition] = cell

    def unready(self, topic: str, partition: int) -> None:
        """Send (topic, partition) through the general path again (a skip or cert is due)."""
        lanes = self.ready.get(topic)
        if lanes is not None:
            lanes.pop(partition, None)

    def counters(self) -> dict[TopicPartition, int]:
        """The next seq of every (topic, partition) with a counter."""
        return {(t, p): cell[0] for t, lanes in self._lanes.items() for p, cell in lanes.items()}

    def fence_header(self, topic: str, partition: int) -> bytes:
        """A FENCE header announcing this generation on (topic, partition); does not advance seq.

        Its seq is the partition's next seq, so a broker that never saw this pid starts the entry
        at ``seq - 1`` and accepts the next data record.
        """
        return encode_pf(self.pid, self.generation, self.peek(topic, partition), FLAG_FENCE)

    def fences(
        self,
        from_generation: int | None = None,
        partitions: Iterable[TopicPartition] = (),
    ) -> list[tuple[str, int, bytes]]:
        """FENCE headers for every (topic, partition) this sequencer knows, sorted.

        With ``from_generation``, each partition gets one FENCE per generation from it up to the
        current one, in order: the broker rules accept a generation at most one above the one
        they hold, so a resume whose bump skipped generations (a predecessor bumped, then died
        before writing its FENCEs) walks every partition up one generation at a time.

        ``partitions`` are fenced too, also those without a counter: a predecessor may have
        first written a partition after the checkpoint was taken, and left the broker at an
        older generation there.
        """
        targets = set(self.counters()) | set(partitions)
        low = self.generation if from_generation is None else max(from_generation, 0)
        return [
            (t, p, encode_pf(self.pid, g, self.peek(t, p), FLAG_FENCE))
            for t, p in sorted(targets)
            for g in range(min(low, self.generation), self.generation + 1)
        ]

    def partitions(self) -> list[TopicPartition]:
        """Every (topic, partition) with a counter, sorted."""
        return sorted(self.counters())

    def checkpoint(self, taken_ms: int = 0) -> ProducerCheckpoint:
        """The current identity and next seqs (store it once everything sent is acknowledged)."""
        counters = self.counters()
        return ProducerCheckpoint(
            self.pid,
            self.generation,
            self.expire_ms,
            counters,
            self.lifetime_ms,
            self.secret,
            skip=dict(self.skip),
            resend={tp: tuple(sends) for tp, sends in self.resend.items() if tp in self.skip},
            taken_ms=taken_ms,
            ahead={tp: n for tp, n in self.ahead.items() if n > counters.get(tp, 0)},
            ahead_holes={
                tp: tuple(above)
                for tp, holes in self.ahead_holes.items()
                if self.ahead.get(tp, 0) > counters.get(tp, 0)
                and (
                    above := [
                        (max(a, counters.get(tp, 0)), b)
                        for a, b in holes
                        if b >= counters.get(tp, 0)
                    ]
                )
            },
            topics=tuple(sorted(self.topics | {t for t, _ in counters})),
            mac_key=self.mac_key or b"",
            fenced={tp: g for tp, g in self.fenced.items() if g == self.generation},
        )
