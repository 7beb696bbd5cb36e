"""A simulated attacker with write (and read) access to the raw topic, but not to the lease server.

It forges what issue 13 names (DESIGN §3 amended): a ``FENCE`` one generation ahead of a live
legitimate pid, and fresh pids whose first record has seq 0, each without a ``pfc`` or with a bad
one: signed by its own key, not msgpack, of the wrong length, naming another identity (a real
certificate copied from the topic), or a real certificate whose lease has ended. And what issue
22 names (DESIGN §3 amended again): a genuine placed ``pfc`` copied from one partition onto
another (as a FENCE at seq 2**62, or a first record at seq 0), and, on a topic whose timestamps
are the broker's (``log_append_time``), a genuine ended certificate on a record back-dated to
before its end. With the sink verifying, every one of them must be ``FORGED``;
:attr:`Attacker.sent` lists them so the runner can check each verdict.

It reads the topic as any consumer could (headers, ``pfc`` values) and never looks at the sink's
state, so a forgery's effect depends only on what is in Kafka before it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.sim.kafka import SimKafka
from pidfence.wire import FLAG_FENCE, MalformedHeader, decode_pf, encode_pf
from pidfence.wire.cert import encode_cert
from pidfence.wire.statement import decode_pfc, encode_placed_pfc

#: What the attacker writes: a FENCE one generation ahead of a live pid (``fence_*``) or the
#: first record (seq 0) of a pid no lease server issued (``fresh_*``), with the ``pfc`` named by
#: the suffix (``none``: no header; ``foreign``: a placed pfc whose certificate the attacker
#: signed; ``bare``: a certificate without the placed envelope; ``garbage``: not msgpack;
#: ``short``: a 5-element certificate; ``sig63``: a 63-byte signature; ``stolen``: another
#: pid's real placed pfc; ``expired``: a real one whose lease ended, on a partition its pid never
#: wrote), a real placed pfc replayed on another partition (``replay_*``), or a back-dated ended
#: one (``backdated``, on a LogAppendTime topic only). In the per-record mode it also injects a
#: data record at a live pid's next seq inside its generation (:data:`INJECTIONS`), which needs
#: no certificate and which only the record MAC stops.
Attack = Literal[
    "fence_none",
    "fence_foreign",
    "fence_garbage",
    "fence_short",
    "fence_sig63",
    "fence_stolen",
    "fence_expired",
    "fresh_none",
    "fresh_foreign",
    "fresh_stolen",
    "fresh_fence_foreign",
    "fresh_bare",
    "replay_fence",
    "replay_first",
    "backdated",
]
ATTACKS: Final[tuple[str, ...]] = get_args(Attack)
#: The per-record mode's injections: no ``pfm``, a random one, or a genuine one copied from
#: another record of the same pid.
INJECTIONS: Final[tuple[str, ...]] = ("inject_none", "inject_random", "inject_copied")
#: Attacker pids: far above what the simulated lease server issues (it starts below 2**40).
FRESH_PID_BASE: Final = 1 << 50


@dataclass(frozen=True, slots=True)
class Forgery:
    """One forged record in Kafka."""

    partition: int
    offset: int
    attack: str
    pid: int
    generation: int


@dataclass(slots=True)
class _Seen:
    """What the topic shows about one legitimate pid on one partition."""

    generation: int = -1
    seq: int = -1
    #: The partition's largest timestamp up to this pid's latest record: the sink's entry for
    #: the pid was created at or before it, so it has expired once a lifetime has passed.
    reach_ms: int = 0


@dataclass(slots=True)
class _View:
    """The attacker's reading of the topic so far (its own records excluded)."""

    cursors: list[int]
    #: Per partition, the largest record timestamp read.
    max_ts: list[int]
    #: (pid, partition) -> highest generation and seq seen.
    seen: dict[tuple[int, int], _Seen] = field(default_factory=dict)
    #: pid -> (generation, expire_ms, cert) of the highest generation whose cert was seen.
    certs: dict[int, tuple[int, int, bytes]] = field(default_factory=dict)
    #: Genuine ``pfc`` values as read: (partition, pid, generation, pfc).
    placed: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    #: pid -> the latest genuine ``pfm`` read of it.
    macs: dict[int, bytes] = field(default_factory=dict)


class Attacker:
    """Writes forged records into the simulated topic on a seeded schedule.

    Args:
        rng: its own randomness (so schedules without attacks stay exactly as they were).
        kafka: the topic it writes to and reads.
        lifetime_ms: the lease lifetime (its forged certs claim one).
        record_mac: the per-record mode is on: injections join the attacks.
    """

    def __init__(
        self, rng: random.Random, kafka: SimKafka, lifetime_ms: int, record_mac: bool = False
    ) -> None:
        self.rng = rng
        self.attacks = ATTACKS + INJECTIONS if record_mac else ATTACKS
        self.kafka = kafka
        self.lifetime_ms = lifetime_ms
        self.key = Ed25519PrivateKey.from_private_bytes(rng.randbytes(32))
        self.view = _View([0] * len(kafka.partitions), [0] * len(kafka.partitions))
        self.mine: set[tuple[int, int]] = set()
        self.sent: list[Forgery] = []
        self._next_fresh = FRESH_PID_BASE + rng.randrange(1 << 40)

    def _read(self) -> None:
        view = self.view
        for p, records in enumerate(self.kafka.partitions):
            for rec in records[view.cursors[p] :]:
                view.max_ts[p] = max(view.max_ts[p], rec.ts_ms)
                if (p, rec.offset) in self.mine or rec.header is None:
                    continue
                try:
                    pf = decode_pf(rec.header)
                except MalformedHeader:
                    continue
                seen = view.seen.setdefault((pf.pid, p), _Seen())
                seen.generation = max(seen.generation, pf.generation)
                seen.seq = max(seen.seq, pf.seq)
                seen.reach_ms = view.max_ts[p]
                if rec.mac is not None:
                    view.macs[pf.pid] = rec.mac
                if rec.cert is not None:
                    parts = decode_pfc(rec.cert)
                    if parts is None:
                        continue
                    expire = msgpack.unpackb(parts.cert)[3]
                    known = view.certs.get(pf.pid)
                    if known is None or known[0] < pf.generation:
                        view.certs[pf.pid] = (pf.generation, expire, rec.cert)
                    view.placed.append((p, pf.pid, pf.generation, rec.cert))
            view.cursors[p] = len(records)

    def attack(self, now: int) -> Forgery | None:
        """Write one forged record (its kind drawn from :data:`ATTACKS`); None if no target."""
        self._read()
        kind = self.attacks[self.rng.randrange(len(self.attacks))]
        mac: bytes | None = None
        if kind.startswith("inject_"):
            made, mac = self._inject(kind, now)
        elif kind.startswith("fresh_"):
            made = self._fresh(kind, now)
        else:
            made = self._fence(kind, now)
        if made is None:  # no target (say no live pid yet)
            return None
        partition, header, cert, pid, generation = made
        value = b"" if decode_pf(header).flags & FLAG_FENCE else f"attack:{len(self.sent)}".encode()
        stamp = now
        if kind == "backdated":
            # Set to before the certificate's end, as a writer can with CreateTime.
            stamp = min(now, msgpack.unpackb(decode_pfc(cert).cert)[3] - 1)  # type: ignore[union-attr]
        offset = self.kafka.append(partition, header, b"attacker", value, stamp, cert, mac)
        self.mine.add((partition, offset))
        forgery = Forgery(partition, offset, kind, pid, generation)
        self.sent.append(forgery)
        return forgery

    def _inject(
        self, kind: str, now: int
    ) -> tuple[tuple[int, bytes, bytes | None, int, int] | None, bytes | None]:
        """A data record at a live pid's next seq in its latest generation, and its ``pfm``."""
        view = self.view
        live = sorted(
            (pid, p)
            for (pid, p), seen in view.seen.items()
            if pid in view.certs and view.certs[pid][1] > now and seen.generation >= 0
        )
        if kind == "inject_copied":
            live = [(pid, p) for pid, p in live if pid in view.macs]
        if not live:
            return None, None
        pid, p = live[self.rng.randrange(len(live))]
        seen = view.seen[(pid, p)]
        mac = {
            "inject_none": None,
            "inject_random": self.rng.randbytes(16),
            "inject_copied": view.macs.get(pid),
        }[kind]
        header = encode_pf(pid, seen.generation, seen.seq + 1)
        return (p, header, None, pid, seen.generation), mac

    def _placed(self, cert: bytes, pid: int, generation: int) -> bytes:
        """``cert`` in a placed envelope, with the attacker's own statement (any place: the
        certificate is refused first)."""
        return encode_placed_pfc(cert, self.key, "sim", 0, pid, generation, 0, 0)

    def _cert(self, style: str, pid: int, generation: int, now: int) -> bytes | None:
        """A bad ``pfc`` for (pid, generation) of the given style (None: no header)."""
        expire = now + self.lifetime_ms
        mine = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        if style == "foreign":
            # A well-formed placed pfc whose certificate the attacker signed itself.
            cert = encode_cert(self.key, pid, generation, expire, producer_key=mine)
            return self._placed(cert, pid, generation)
        if style == "bare":
            # A certificate alone, outside the placed envelope (names no place): malformed.
            return encode_cert(self.key, pid, generation, expire)
        if style == "garbage":
            return b"\xc1" + self.rng.randbytes(20)  # 0xc1 is never valid msgpack
        if style == "short":
            return self._placed(msgpack.packb([2, pid, generation, expire, mine]), pid, generation)
        if style == "sig63":
            cert = msgpack.packb([2, pid, generation, expire, mine, self.rng.randbytes(63)])
            return self._placed(cert, pid, generation)
        if style == "stolen":
            others = sorted(self.view.certs)
            if not others:
                return None
            # A real cert of some pid, for another (pid, generation): other_identity.
            return self.view.certs[others[self.rng.randrange(len(others))]][2]
        return None

    def _fence(self, kind: str, now: int) -> tuple[int, bytes, bytes | None, int, int] | None:
        if kind.startswith("replay_"):
            return self._replay(kind, now)
        if kind == "backdated":
            return self._expired(now) if self.kafka.log_append_time else None
        style = kind.removeprefix("fence_")
        view = self.view
        if style == "expired":
            return self._expired(now)
        # Live pids: their newest cert's lease has not ended.
        live = sorted(
            (pid, p)
            for (pid, p), seen in view.seen.items()
            if pid in view.certs and view.certs[pid][1] > now and seen.generation >= 0
        )
        if not live:
            return None
        pid, p = live[self.rng.randrange(len(live))]
        seen = view.seen[(pid, p)]
        generation = seen.generation + 1
        cert = self._cert(style, pid, generation, now)
        if style == "stolen" and cert is None:
            return None
        header = encode_pf(pid, generation, seen.seq + 1, FLAG_FENCE)
        return p, header, cert, pid, generation

    def _unknown_on(self, pid: int, p: int, now: int) -> bool:
        """Whether the sink can hold no entry for ``pid`` on partition ``p``: it never wrote
        there, or a lifetime has passed since the partition's clock could last create one."""
        seen = self.view.seen.get((pid, p))
        return seen is None or seen.reach_ms + self.lifetime_ms <= now

    def _replay(self, kind: str, now: int) -> tuple[int, bytes, bytes | None, int, int] | None:
        """A genuine placed ``pfc`` copied onto another partition, where its pid is unknown:
        a FENCE at seq 2**62 (every later record of the pid there would be DUPLICATE) or a
        first record at seq 0 (the pid's own records there would be DUPLICATE)."""
        partitions = len(self.kafka.partitions)
        targets = sorted(
            (src, pid, g, pfc, q)
            for src, pid, g, pfc in self.view.placed
            for q in range(partitions)
            if q != src and self._unknown_on(pid, q, now)
        )
        if not targets:
            return None
        src, pid, g, pfc, q = targets[self.rng.randrange(len(targets))]
        del src
        if kind == "replay_fence":
            return q, encode_pf(pid, g, 2**62, FLAG_FENCE), pfc, pid, g
        return q, encode_pf(pid, g, 0), pfc, pid, g

    def _expired(self, now: int) -> tuple[int, bytes, bytes | None, int, int] | None:
        """A real, ended cert, where the sink can hold no entry for its pid any more.

        That is a partition the pid never wrote, or one where a lifetime has passed since the
        partition's clock could last have created the pid's entry: the FENCE would create one.
        """
        view = self.view
        partitions = len(self.kafka.partitions)
        targets = sorted(
            (pid, p)
            for pid, (_, expire, _) in view.certs.items()
            if expire <= now
            for p in range(partitions)
            if self._unknown_on(pid, p, now)
        )
        if not targets:
            return None
        pid, p = targets[self.rng.randrange(len(targets))]
        generation, _, cert = view.certs[pid]
        return p, encode_pf(pid, generation, 0, FLAG_FENCE), cert, pid, generation

    def _fresh(self, kind: str, now: int) -> tuple[int, bytes, bytes | None, int, int] | None:
        style = kind.removeprefix("fresh_")
        fence = style.startswith("fence_")
        style = style.removeprefix("fence_")
        pid = self._next_fresh
        generation = self.rng.randrange(1 << 20)
        cert = self._cert(style, pid, generation, now)
        if style == "stolen" and cert is None:
            return None
        self._next_fresh += 1
        p = self.rng.randrange(len(self.kafka.partitions))
        header = encode_pf(pid, generation, 0, FLAG_FENCE if fence else 0)
        return p, header, cert, pid, generation
