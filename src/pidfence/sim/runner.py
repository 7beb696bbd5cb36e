"""One seeded schedule, end to end: the real producers, network, Kafka, sink, checker."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.producer import ProducerSession
from pidfence.sim.attacker import Attacker, Forgery
from pidfence.sim.broken_rules import broken_rules
from pidfence.sim.client import TOPIC, Network
from pidfence.sim.kafka import KafkaRecord, SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.sim.lease import SimLeaseServer
from pidfence.sim.losses import Losses, account
from pidfence.sim.oracle import OracleReport, judge, mac_refusal, pf_of, strict_decisions
from pidfence.sim.producer import Producers
from pidfence.sim.sink import CAPACITY, SimSink
from pidfence.sim.world import resend_ended, trim_scanned
from pidfence.verify.check import CheckReport, check
from pidfence.wire import MalformedHeader, Verdict, decode_pf
from pidfence.wire.statement import PlacedCheck

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
        non_idempotent_once: every record without a producer (no ``pf`` header, or pid 0) that
            the sink read is in the log exactly once (Kafka offsets compared).
        log: the output log table; rejects: the rejects table; ledger: acknowledged sends.
        stats: counts of what happened (crashes, zombies, restarts, kafka records, ...;
            ``forged_sent``/``forged_caught``: the attacker's records and how many of them the
            sink judged ``FORGED``; ``forged_reason_*``: every ``FORGED`` verdict by reason).
        forgeries: each attacker record with the verdict the sink gave it.
        losses: what Kafka lost (``kafka_lose_p``) and what that excuses; the report is of the
            ledger without those records, so any other loss is still an anomaly.
        oracle: the output compared per event with the proposal's strict rules on a full view
            of every partition's log (:mod:`pidfence.sim.oracle`).
    """

    seed: int
    knobs: Knobs
    report: CheckReport
    exactly_once: bool
    non_idempotent_once: bool
    log: pa.Table
    rejects: pa.Table
    ledger: list[LedgerEntry]
    stats: dict[str, int] = field(default_factory=dict)
    forgeries: list[tuple[Forgery, str]] = field(default_factory=list)
    losses: Losses | None = None
    oracle: OracleReport = field(default_factory=OracleReport)

    @property
    def forgeries_refused(self) -> bool:
        """Every attacker record was judged ``FORGED`` (trivially true without an attacker), or
        ``INVALID_GENERATION`` if it carries no certificate: an unsigned ``FENCE`` several
        generations ahead of the partition looks exactly like a resume's own unsigned
        intermediate ones, and is refused as they are, changing nothing."""
        return all(
            verdict == "FORGED"
            or (verdict == "INVALID_GENERATION" and forgery.attack.endswith("_none"))
            for forgery, verdict in self.forgeries
        )

    @property
    def ok(self) -> bool:
        """No anomaly, exactly-once delivery of the upstream and of the records without a
        producer, every forgery ``FORGED``, and no difference from the strict rules but the
        allowed ones."""
        return (
            self.report.ok
            and self.exactly_once
            and self.non_idempotent_once
            and self.forgeries_refused
            and self.oracle.ok
        )

    def replay_hint(self) -> str:
        """The Python call and the shell command that replay this schedule exactly."""
        return replay_hint(self.seed, self.knobs)

    def describe(self) -> str:
        """A short multi-line summary for failure messages and the CLI."""
        return (
            f"seed {self.seed}: {self.report.summary()}, exactly_once={self.exactly_once}, "
            f"non_idempotent_once={self.non_idempotent_once}, "
            f"{self.oracle.summary()}, stats={self.stats}\nreplay: {self.replay_hint()}"
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

    def narrow(session: ProducerSession, walk_from: int, partitions: Iterable[Any]) -> Any:
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
        random.Random(f"pidfence-sim-lease:{seed}"),
        k.lifetime_ms,
        signing_key=signing,
        outage_p=k.lease_down_p,
        outage_rng=random.Random(f"pidfence-sim-lease-outages:{seed}"),
        mac_secret=mac_secret,
        fresh_rollover=k.mutation == "fresh_rollover",
    )
    net = Network(rng, k, kafka)
    # The sink draws nothing at construction: the producers' events come first, as always.
    sink = SimSink(
        rng,
        k,
        kafka,
        TOPIC,
        [signing.public_key()],
        mac_secret,
        lease.describe if k.authority else None,
    )
    # The producers' recovery scan checks pfc as the sink does (ProducerConfig.lease_public_keys).
    certs = None if k.mutation == "trusting_scan" else sink.certificates
    producers = Producers(
        rng,
        k,
        lease,
        net,
        None if certs is None else certs.for_partition,
        random.Random(f"pidfence-sim-timeouts:{seed}"),
    )
    attacker = Attacker(
        random.Random(f"pidfence-sim-attacker:{seed}"), kafka, k.lifetime_ms, k.record_mac
    )
    # Retention and re-sends of ended leases draw from their own stream too.
    world = random.Random(f"pidfence-sim-world:{seed}")
    now = START_MS
    steps = 0
    try:
        with contextlib.ExitStack() as variants:
            if not k.fence_all:
                variants.enter_context(fences_on_counters_only())
            # Broken broker rules are patched in for the schedule only: the oracle's are real.
            variants.enter_context(broken_rules(k.mutation))
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
                if k.trim_p and world.random() < k.trim_p:
                    trim_scanned(kafka, producers.chains, world)
                if k.resend_p and world.random() < k.resend_p:
                    resend_ended(kafka, net.ledger, now, world)
                if steps == max(k.sink_start, 1) and k.sink_latest:
                    sink.start_at_end()
                if steps >= k.sink_start and steps % k.batch_every == 0:
                    sink.batch()
                now += k.step_ms
            # The last batch waits for the lease servers' outage to end, as a sink retries.
            lease.now = max(now, lease.down_until)
            if k.sink_latest and sink.first_offset is None:
                sink.start_at_end()
            sink.batch(final=True)
    finally:
        lease.close()
    log, rejects = sink.tables_out()
    read = [(p, rec) for p, rows in enumerate(sink.read) for rec in rows]
    seen = {(p, rec.offset) for p, rec in read}
    unread = [
        (p, rec)
        for p, records in enumerate(kafka.partitions)
        for rec in records
        if (p, rec.offset) not in seen
    ]
    mine = {(f.partition, f.offset) for f in attacker.sent}
    losses = account(
        kafka.lost,
        sink.gaps,
        rejects,
        unread,
        log,
        stored=kafka.partitions,
        reorder_window=sink.tables[0].reorder_window,
        forged=mine,
    )
    # Under signing a producer is adopted at its next certificate: the records before it are
    # UNVERIFIED, named by the sink (DESIGN §3 amended again), and excused like Kafka's losses.
    unverified = {
        (pid, p, seq)
        for pid, p, seq, verdict in zip(
            rejects["pid"].to_pylist(),
            rejects["partition"].to_pylist(),
            rejects["seq"].to_pylist(),
            rejects["verdict"].to_pylist(),
            strict=True,
        )
        if verdict == Verdict.UNVERIFIED.value
    }

    def excused(e: Any) -> bool:
        return losses.covers(e.pid, e.partition, e.seq, e.offset) or (
            (e.pid, e.partition, e.seq) in unverified
        )

    # The oracle's own certificate and MAC checks: fresh instances, never the sink's (and on
    # whatever a mutation turned off there).
    check_certs = PlacedCheck([signing.public_key()])
    refused = mac_refusal(TOPIC, mac_secret)
    strict = [
        decided
        for p in range(k.partitions)
        for decided in strict_decisions(
            kafka, p, CAPACITY, k.lifetime_ms, check_certs.for_partition(TOPIC, p), refused
        )
    ]
    oracle = judge(
        strict,
        [(p, rec) for p, rows in enumerate(sink.log) for rec, _ in rows if pf_of(rec)],
        seen,
        set(losses.collateral),
        sink.verdict_at,
        sink.gaps,
    )
    # Events the strict rules append only under copies the sink could not read or verify (the
    # oracle's named losses), whichever copy Kafka acknowledged: a doubled delivery's later copy
    # (FENCED after a resume's FENCE) or a fenced zombie's may hold the ack while the appendable
    # copy lies before the sink's start or was deleted unread.
    named = {value_digest(v) for v in oracle.named_losses}

    # Kafka's losses are the checker's findings by construction; anything else is an anomaly.
    # An event whose only appendable copy was excused is excused with its refused copies (a
    # zombie's FENCED one, say); copies in the log are still judged.
    gone_events = {e.event_id for e in net.ledger if excused(e) or e.digest in named}
    logged = set(
        zip(
            log["pid"].to_pylist(),
            log["partition"].to_pylist(),
            log["seq"].to_pylist(),
            strict=True,
        )
    )
    ledger = [
        e
        for e in net.ledger
        if not excused(e)
        and not (e.event_id in gone_events and (e.pid, e.partition, e.seq) not in logged)
    ]
    report = check(ledger, log, rejects, gaps=sink.gaps_table())
    gone = {e.digest for e in net.ledger if excused(e)}
    # Events with a copy the sink never read (the oracle judges whether one it read was owed).
    gone |= {value_digest(rec.value) for _, rec in unread}
    acknowledged = {e.digest for e in net.ledger}
    upstream = [value for chain in producers.chains for _, value, _ in chain.events]
    # A forgery retention deleted before the sink read it was never judged: nothing to refuse.
    forgeries = [
        (f, sink.verdict_at[f.partition].get(f.offset, Verdict.BUFFERED).value)
        for f in attacker.sent
        if (f.partition, f.offset) in seen
    ]
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
        **{f"gaps_{kind}": n for kind, n in sorted(Counter(g[1] for g in sink.gaps).items())},
        **{
            f"attack_{kind}": n
            for kind, n in sorted(Counter(f.attack for f in attacker.sent).items())
        },
    }
    stats.update({f"oracle_excused_{name}": n for name, n in sorted(oracle.excused.items())})
    stats["sink_unanswered"] = sink.unanswered
    want = Counter(upstream)
    # Exactly once: nothing extra or twice, and nothing missing but what Kafka lost.
    # Events never acknowledged whose copies a resume found in Kafka and skipped (to its
    # producer, delivered): excused as an acknowledged one is when the strict rules append them
    # only under copies the sink could not read or verify (the oracle's named losses). A copy
    # owed otherwise (held, refused) keeps the event owed, and so does one never in Kafka.
    gone |= {
        digest
        for value in oracle.named_losses
        if (digest := value_digest(value)) not in acknowledged
    }
    exact = not (got - want) and all(value_digest(v) in gone for v in want - got)
    # Records without a producer are appended on arrival, each once: the log's pid-0 rows are
    # exactly those the sink read (what a checker of events cannot see: they carry none).
    plain_read = Counter((p, rec.offset) for p, rec in read if _plain(rec))
    plain_logged = Counter(
        (p, offset)
        for p, offset, pid in zip(
            log["partition"].to_pylist(),
            log["offset"].to_pylist(),
            log["pid"].to_pylist(),
            strict=True,
        )
        if pid == 0
    )
    stats["non_idempotent_read"] = sum(plain_read.values())
    return SimResult(
        seed,
        k,
        report,
        exact,
        plain_read == plain_logged,
        log,
        rejects,
        net.ledger,
        stats,
        forgeries,
        losses,
        oracle,
    )


def _plain(rec: KafkaRecord) -> bool:
    """A record without a producer: no ``pf`` header, or a well-formed one with pid 0."""
    if rec.header is None:
        return True
    try:
        return decode_pf(rec.header).pid == 0
    except MalformedHeader:
        return False
