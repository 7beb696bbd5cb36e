"""A simulated attacker with write (and read) access to the raw topic, but not to the lease server.

It forges what issue 13 names (DESIGN §3 amended): a ``FENCE`` one generation ahead of a live
legitimate pid, and fresh pids whose first record has seq 0, each without a ``pfc`` or with a bad
one: signed by its own key, not msgpack, of the wrong length, naming another identity (a real
certificate copied from the topic), or a real certificate whose lease has ended. With the sink
verifying, every one of them must be ``FORGED``; :attr:`Attacker.sent` lists them so the runner
can check each verdict.

It reads the topic as any consumer could (headers, ``pfc`` values) and never looks at the sink's
state, so a forgery's effect depends only on what is in Kafka before it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.sim.kafka import SimKafka
from pidfence.wire import FLAG_FENCE, MalformedHeader, decode_pf, encode_pf
from pidfence.wire.cert import encode_cert

#: What the attacker writes: a FENCE one generation ahead of a live pid (``fence_*``) or the
#: first record (seq 0) of a pid no lease server issued (``fresh_*``), with the ``pfc`` named by
#: the suffix (``none``: no header; ``foreign``: signed by the attacker's key; ``garbage``: not
#: msgpack; ``short``: a 4-element array; ``sig63``: a 63-byte signature; ``stolen``: the pid's
#: own real cert of the current generation, or another pid's; ``expired``: a real cert whose lease
#: ended, on a partition its pid never wrote).
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
]
ATTACKS: Final[tuple[str, ...]] = get_args(Attack)
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


class Attacker:
    """Writes forged records into the simulated topic on a seeded schedule.

    Args:
        rng: its own randomness (so schedules without attacks stay exactly as they were).
        kafka: the topic it writes to and reads.
        lifetime_ms: the lease lifetime (its forged certs claim one).
    """

    def __init__(self, rng: random.Random, kafka: SimKafka, lifetime_ms: int) -> None:
        self.rng = rng
        self.kafka = kafka
        self.lifetime_ms = lifetime_ms
        self.key = Ed25519PrivateKey.from_private_bytes(rng.randbytes(32))
        self.view = _View([0] * len(kafka.partitions), [0] * len(kafka.partitions))
        self.mine: set[tuple[int, int]] = set()
        self.sent: list[Forgery] = []
        #: Attempts that found no target (say no live pid yet), by attack.
        self.idle: Counter[str] = Counter()
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
                if rec.cert is not None:
                    expire = msgpack.unpackb(rec.cert)[3]
                    known = view.certs.get(pf.pid)
                    if known is None or known[0] < pf.generation:
                        view.certs[pf.pid] = (pf.generation, expire, rec.cert)
            view.cursors[p] = len(records)

    def attack(self, now: int) -> Forgery | None:
        """Write one forged record (its kind drawn from :data:`ATTACKS`); None if no target."""
        self._read()
        kind = ATTACKS[self.rng.randrange(len(ATTACKS))]
        made = self._fresh(kind, now) if kind.startswith("fresh_") else self._fence(kind, now)
        if made is None:
            self.idle[kind] += 1
            return None
        partition, header, cert, pid, generation = made
        value = b"" if decode_pf(header).flags & FLAG_FENCE else f"attack:{len(self.sent)}".encode()
        offset = self.kafka.append(partition, header, b"attacker", value, now, cert)
        self.mine.add((partition, offset))
        forgery = Forgery(partition, offset, kind, pid, generation)
        self.sent.append(forgery)
        return forgery

    def _cert(self, style: str, pid: int, generation: int, now: int) -> bytes | None:
        """A bad ``pfc`` for (pid, generation) of the given style (None: no header)."""
        expire = now + self.lifetime_ms
        if style == "foreign":
            return encode_cert(self.key, pid, generation, expire)
        if style == "garbage":
            return b"\xc1" + self.rng.randbytes(20)  # 0xc1 is never valid msgpack
        if style == "short":
            return msgpack.packb([1, pid, generation, expire])
        if style == "sig63":
            return msgpack.packb([1, pid, generation, expire, self.rng.randbytes(63)])
        if style == "stolen":
            others = sorted(self.view.certs)
            if not others:
                return None
            # A real cert of some pid, for another (pid, generation): other_identity.
            return self.view.certs[others[self.rng.randrange(len(others))]][2]
        return None

    def _fence(self, kind: str, now: int) -> tuple[int, bytes, bytes | None, int, int] | None:
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
            if (pid, p) not in view.seen or view.seen[(pid, p)].reach_ms + self.lifetime_ms <= now
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
