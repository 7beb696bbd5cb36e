"""One seeded schedule, end to end: the real producers, network, Kafka, sink, checker."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.producer import ProducerSession
from pidfence.sim.attacker import Attacker, Forgery
from pidfence.sim.client import TOPIC, Network
from pidfence.sim.kafka import SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.sim.lease import SimLeaseServer
from pidfence.sim.losses import Losses, account
from pidfence.sim.producer import Producers
from pidfence.sim.sink import SimSink
from pidfence.verify.check import CheckReport, check
from pidfence.wire import Verdict

START_MS = 1_763_800_000_000
MAX_STEPS = 100_000
_DEFAULTS = Knobs().to_dict()


@dataclass(slots=True)
class SimResult:
    """What one schedule produced.

    Attributes:
        seed: the seed; ``pidfence.sim.run(seed, **knobs.to_dict())`` replays it exactly.
        knobs: the schedule's knobs.
        report: the checker's verdict on the simulated ledger, log and rejects.
        exactly_once: every upstream event is in the log exactly once (values compared).
        log: the output log table; rejects: the rejects table; ledger: acknowledged sends.
        stats: counts of what happened (crashes, zombies, restarts, kafka records, ...;
            ``forged_sent``/``forged_caught``: the attacker's records and how many of them the
            sink judged ``FORGED``; ``forged_reason_*``: every ``FORGED`` verdict by reason).
        forgeries: each attacker record with the verdict the sink gave it.
        losses: what Kafka lost (``kafka_lose_p``) and what that excuses; the report is of the
            ledger without those records, so any other loss is still an anomaly.
    """

    seed: int
    knobs: Knobs
    report: CheckReport
    exactly_once: bool
    log: pa.Table
    rejects: pa.Table
    ledger: list[LedgerEntry]
    upstream: list[bytes]
    stats: dict[str, int] = field(default_factory=dict)
    forgeries: list[tuple[Forgery, str]] = field(default_factory=list)
    losses: Losses | None = None

    @property
    def forgeries_refused(self) -> bool:
        """Every attacker record was judged ``FORGED`` (trivially true without an attacker)."""
        return all(verdict == "FORGED" for _, verdict in self.forgeries)

    @property
    def ok(self) -> bool:
        """No anomaly, exactly-once delivery of the upstream, every forgery ``FORGED``."""
        return self.report.ok and self.exactly_once and self.forgeries_refused

    def replay_hint(self) -> str:
        """The Python call and the shell command that replay this schedule exactly."""
        return replay_hint(self.seed, self.knobs)

    def describe(self) -> str:
        """A short multi-line summary for failure messages and the CLI."""
        return (
            f"seed {self.seed}: {self.report.summary()}, exactly_once={self.exactly_once}, "
            f"stats={self.stats}\nreplay: {self.replay_hint()}"
        )


def replay_hint(seed: int, knobs: Knobs) -> str:
    """The Python call and the shell command that replay ``seed`` under ``knobs`` exactly.

    Usable before :func:`run` returns, so a schedule that raises can still be replayed.
    """
    values = knobs.to_dict()
    args = ", ".join(f"{k}={v!r}" for k, v in values.items())
    flags = [f"--seed {seed}"]
    for name, value in values.items():
        if value == _DEFAULTS[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags.append(f"{flag} {value!r}" if isinstance(value, float) else f"{flag} {value}")
    return f"pidfence.sim.run({seed}, {args})\n        or: python -m pidfence.sim {' '.join(flags)}"


@contextmanager
def fences_on_counters_only() -> Iterator[None]:
    """``fence_all=False``: the resume FENCEs only the partitions its checkpoint has seqs on.

    The producer's session always FENCEs every partition of its topics; this variant (the
    resume before that rule, kept to show why the rule exists) wraps
    :meth:`ProducerSession.fences` for the duration of one schedule.
    """
    real = ProducerSession.fences

    def narrow(session: ProducerSession, walk_from: int, counts: Mapping[str, int]) -> Any:
        return real(session, walk_from, {})

    setattr(ProducerSession, "fences", narrow)  # noqa: B010 - a class attribute, restored below
    try:
        yield
    finally:
        setattr(ProducerSession, "fences", real)  # noqa: B010


def run(seed: int, **knobs: Any) -> SimResult:
    """Run one schedule; the same seed and knobs always give the same result.

    Args:
        seed: seeds every random choice (network, crashes, restarts, events).
        **knobs: fields of :class:`~pidfence.sim.knobs.Knobs`.
    """
    k = Knobs(**knobs)
    rng = random.Random(seed)
    # Keys and the attacker draw from their own streams: a schedule without attacks is the one
    # it was before signing was modelled.
    signing = Ed25519PrivateKey.from_private_bytes(
        random.Random(f"pidfence-sim-key:{seed}").randbytes(32)
    )
    kafka = SimKafka(
        k.partitions,
        k.kafka_lose_p,
        random.Random(f"pidfence-sim-kafka-losses:{seed}"),
        log_append_time=k.log_append_time,
    )
    mac_secret = random.Random(f"pidfence-sim-mac:{seed}").randbytes(32) if k.record_mac else None
    lease = SimLeaseServer(
        rng,
        k.lifetime_ms,
        fresh_rollover=k.mutation == "fresh_rollover",
        signing_key=signing,
        outage_p=k.lease_down_p,
        outage_rng=random.Random(f"pidfence-sim-lease-outages:{seed}"),
        mac_secret=mac_secret,
    )
    net = Network(rng, k, kafka)
    # The sink draws nothing at construction: the producers' events come first, as always.
    sink = SimSink(rng, k, kafka, TOPIC, [signing.public_key()], mac_secret)
    # The producers' recovery scan checks pfc as the sink does (ProducerConfig.lease_public_keys).
    certs = None if k.mutation == "trusting_scan" else sink.certificates
    producers = Producers(rng, k, lease, net, None if certs is None else certs.for_partition)
    attacker = Attacker(
        random.Random(f"pidfence-sim-attacker:{seed}"), kafka, k.lifetime_ms, k.record_mac
    )
    now = START_MS
    steps = 0
    with contextlib.ExitStack() as variants:
        if not k.fence_all:
            variants.enter_context(fences_on_counters_only())
        while not producers.done:
            steps += 1
            if steps > MAX_STEPS:
                raise RuntimeError(f"seed {seed}: schedule did not finish in {MAX_STEPS} steps")
            kafka.now = now
            producers.step(now)
            if rng.random() < k.plain_p:
                kafka.append(rng.randrange(k.partitions), None, b"", b"plain", now)
            if k.attack_p and attacker.rng.random() < k.attack_p:
                attacker.attack(now)
            if steps % k.batch_every == 0:
                sink.batch()
            now += k.step_ms
    sink.batch(final=True)
    log, rejects = sink.tables_out()
    losses = account(kafka.lost, sink.gaps, rejects)
    excused = losses.excused
    # Kafka's losses are the checker's findings by construction; anything else is an anomaly.
    ledger = [e for e in net.ledger if (e.pid, e.partition, e.seq) not in excused]
    report = check(ledger, log, rejects)
    gone = {e.digest for e in net.ledger if (e.pid, e.partition, e.seq) in excused}
    upstream = [value for chain in producers.chains for _, value, _ in chain.events]
    forgeries = [
        (f, sink.verdict_at[f.partition].get(f.offset, Verdict.BUFFERED).value)
        for f in attacker.sent
    ]
    mine = {(f.partition, f.offset) for f in attacker.sent}
    got = Counter(
        v for v, pid in zip(log["value"].to_pylist(), log["pid"].to_pylist(), strict=True) if pid
    )
    stats = {
        "steps": steps,
        "kafka_records": sum(len(p) for p in kafka.partitions),
        "log": log.num_rows,
        "rejects": rejects.num_rows,
        "ledger": len(net.ledger),
        "batches": sink.batches,
        "restarts": sink.restarts,
        "snapshots_full": sink.snapshot_counts["full"],
        "snapshots_delta": sink.snapshot_counts["delta"],
        "expired_entries": sink.expired_entries(),
        **producers.counts,
        **{f"lease_{name}": n for name, n in lease.counts.items()},
        **net.counts,
        **{f"verdict_{name}": n for name, n in sorted(sink.verdicts.items())},
        "forged_sent": len(attacker.sent),
        "forged_caught": sum(1 for _, v in forgeries if v == "FORGED"),
        # FORGED verdicts on the legitimate producers' records: the unsigned lower FENCEs of a
        # resume's generation walk (harmless: the signed top FENCE moves the generation).
        "forged_legit": sum(
            1
            for p, verdicts in enumerate(sink.verdict_at)
            for offset, v in verdicts.items()
            if v is Verdict.FORGED and (p, offset) not in mine
        ),
        **{f"forged_reason_{r}": n for r, n in sorted(sink.forged_reasons.items())},
        **losses.stats(),
        "gaps_reported": len(sink.gaps),
        **{
            f"attack_{kind}": n
            for kind, n in sorted(Counter(f.attack for f in attacker.sent).items())
        },
    }
    want = Counter(upstream)
    # Exactly once: nothing extra or twice, and nothing missing but what Kafka lost.
    exact = not (got - want) and all(value_digest(v) in gone for v in want - got)
    return SimResult(
        seed,
        k,
        report,
        exact,
        log,
        rejects,
        net.ledger,
        upstream,
        stats,
        forgeries,
        losses,
    )
