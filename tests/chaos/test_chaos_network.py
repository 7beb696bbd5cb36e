"""The network nemesis: seeded toxics on every link while producers, lease server and sink run.

Each link runs through a proxy of its own (toxiproxy): producers to Kafka (the broker advertises
the proxy, so reconnects go through it too), producers to the lease server, the lease server to
ZooKeeper, the sink to Kafka. A seeded plan (``FaultPlan.network``) puts latency with jitter,
blackholes, one-way loss (requests arrive, replies do not), resets, bandwidth limits and slicing
on them for ``SPAN_S`` seconds, then heals. The faults start once every link is in use: the
streaming sink has committed a first batch (of a warm-up producer's records) and every producer
has an acknowledgement. Leases are short, so producers call the lease server (and it ZooKeeper)
during the faults. A supervisor restarts a process that exits 75 (retriable),
as an operator would; any other exit fails the test.

Judged: the event checker (zero anomalies, ``event_duplicate`` and ``event_lost`` included), every
record once in the log, every process done within ``HANG_S`` of the network healing, no traceback
in any process's output. The seed is printed; ``PIDFENCE_NEMESIS_SEED=N`` replays it. A producer
built to re-send under a new seq after a timeout fails the same nemesis (its teeth).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from pidfence.demo.procs import ProducerRole, Worker, sink_argv
from pidfence.services import create_topic
from pidfence.services.lease_server import spawn_lease_server
from pidfence.services.process import wait_until
from pidfence.testing import (
    FaultKind,
    FaultPlan,
    Link,
    LinkFaults,
    NetworkNemesis,
    Supervisor,
    drive,
    link_proxies,
)
from tests.chaos.conftest import ChaosKit, Outcome

pytestmark = pytest.mark.timeout(600)

#: Seconds of faults; then every link heals.
SPAN_S = 20.0
PRODUCERS = 2
#: Records per producer, sent at RATE per second: they produce through the whole span.
RECORDS = 1500
RATE = 75.0
#: Leases roll over every 7.5 s (rollover at 3/4), so the lease links matter during the span.
LIFETIME_MS = 10_000
#: Every process finishes (or exits 75 and is restarted) within this long after the heal.
HANG_S = 120.0
#: Records a warm-up producer writes so the streaming sink commits a batch before the faults.
WARMUP = 20
#: The broken build's seed: any seed has a one-way loss on the producers' link.
BROKEN_SEED = 24


@dataclass
class NemesisRun:
    """What one nemesis run did and what the checker said."""

    plan: FaultPlan
    nemesis: NetworkNemesis
    supervisors: list[Supervisor]
    outcome: Outcome
    records: int
    done_after_heal_s: float
    tracebacks: list[str]

    def story(self) -> str:
        """The seed, the plan's events and every exit, for failure messages."""
        exits = {s.name: s.exits for s in self.supervisors}
        return f"seed {self.plan.seed}: {self.nemesis.events}; exits {exits}"


def run_nemesis(
    chaos: ChaosKit,
    kafka: Any,
    toxiproxy: Any,
    zk_chroot: str,
    spark: Any,
    stop_all: Any,
    seed: int,
    *,
    live_sink: bool = True,
    mutations: tuple[str, ...] = (),
) -> NemesisRun:
    """Producers, a lease server and (``live_sink``) a streaming sink under the seeded nemesis,
    then one final sink pass and the checker."""
    plan = FaultPlan.network(seed, span_s=SPAN_S)
    tag = uuid.uuid4().hex[:8]
    zk_hosts, _, chroot = zk_chroot.partition("/")
    proxies = link_proxies(toxiproxy, {Link.LEASE_ZOOKEEPER: zk_hosts.split(",")[0]}, tag)
    server = spawn_lease_server(
        f"{proxies[Link.LEASE_ZOOKEEPER].address}/{chroot}", chaos.logs, lifetime_ms=LIFETIME_MS
    )
    stop_all(server)
    proxies |= link_proxies(toxiproxy, {Link.PRODUCER_LEASE: server.address}, tag)
    topic = create_topic(kafka.bootstrap, f"nemesis-{tag}", partitions=2)
    roles: list[ProducerRole] = []
    for i in range(PRODUCERS):
        role = chaos.role(
            f"p{i}",
            kafka.bootstrap_for(Link.PRODUCER_KAFKA),
            proxies[Link.PRODUCER_LEASE].address,
            topic,
            RECORDS,
            rate=RATE,
            extra=("--lifetime-rollover", "0.75"),
            mutations=mutations,
        )
        stop_all(role)
        roles.append(role)
    sinks: list[Worker] = []

    def start_sink() -> Worker:
        argv = sink_argv(
            kafka.bootstrap_for(Link.SINK_KAFKA),
            topic,
            chaos.tmp / "output",
            chaos.tmp / "checkpoint",
            ["--trigger", "1", "--master", "local[2]"],
        )
        worker = Worker(
            f"sink.{len(sinks)}", [a for a in argv if a != "--available-now"], chaos.logs
        )
        stop_all(worker)
        sinks.append(worker.start())
        return worker

    supervisors = [Supervisor(r.spec.name, lambda r=r: r.current, r.spawn) for r in roles]
    warmup = 0
    if live_sink:
        # The sink's query must be up (a batch committed through its proxy) before the faults:
        # a few warm-up records give it that first batch.
        warmup = WARMUP
        first = chaos.role(
            "w",
            kafka.bootstrap_for(Link.PRODUCER_KAFKA),
            proxies[Link.PRODUCER_LEASE].address,
            topic,
            warmup,
        )
        stop_all(first)
        assert first.spawn().wait(120) == 0, first.current.tail()
        start_sink()
        wait_until(
            lambda: "batch 0: " in sinks[0].tail(200) or not sinks[0].running,
            300,
            "the sink's first batch",
        )
        assert sinks[0].running, sinks[0].tail()
        supervisors.append(Supervisor("sink", lambda: sinks[-1], start_sink))
    for role in roles:
        role.spawn()
    # The faults start once every producer has something acknowledged: a fact, not a time.
    wait_until(lambda: all(r.acked() > 0 or not r.running() for r in roles), 120, "first acks")
    nemesis = NetworkNemesis(plan, LinkFaults({**kafka.proxies, **proxies}))
    producers = supervisors[:PRODUCERS]
    try:
        drive(
            [nemesis, *producers],
            timeout=SPAN_S + HANG_S,
            tick=lambda: [s.poll() for s in supervisors[PRODUCERS:]],
            until=lambda: not any(r.running() for r in roles),
        )
    finally:
        nemesis.heal()
    assert nemesis.healed_at is not None
    done_after_heal = time.monotonic() - nemesis.healed_at
    if live_sink:
        sinks[-1].proc.terminate()  # SIGTERM: stops after its running batch
        code = sinks[-1].wait(HANG_S)
        assert code in (0, 75), sinks[-1].tail()
    chaos.sink(spark, kafka.bootstrap, topic)
    tracebacks = [
        log.name
        for log in sorted(chaos.logs.glob("*.log"))
        if "Traceback (most recent call last)" in log.read_text(errors="replace")
    ]
    return NemesisRun(
        plan,
        nemesis,
        supervisors,
        chaos.outcome(),
        PRODUCERS * RECORDS + warmup,
        done_after_heal,
        tracebacks,
    )


@pytest.fixture
def nemesis(
    chaos: ChaosKit,
    kafka_proxied: Any,
    clean_network: Any,
    zk_chroot: str,
    spark: Any,
    stop_all: Any,
) -> Callable[..., NemesisRun]:
    """:func:`run_nemesis` on the proxied Kafka and a clean network: call it with the seed."""
    return partial(run_nemesis, chaos, kafka_proxied, clean_network, zk_chroot, spark, stop_all)


def test_network_nemesis_on_every_link_loses_and_duplicates_nothing(
    nemesis: Callable[..., NemesisRun], nemesis_seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run = nemesis(nemesis_seed)
    story = run.story()
    with capsys.disabled():  # what the nemesis did, on the terminal (the seed replays it)
        exits = {s.name: s.exits for s in run.supervisors}
        print("\n".join(["", *run.nemesis.events, f"exits: {exits}"]))
    assert run.nemesis.happened, story
    # Every link had its faults: a step on a link without a proxy is skipped, not applied.
    assert {Link(s.target) for s in run.plan.network_steps} == set(Link), story
    assert run.nemesis.applied == len(run.plan.network_steps), story
    run.outcome.assert_clean()  # every anomaly, event_duplicate and event_lost included
    assert run.outcome.log.num_rows == run.records, story
    assert run.done_after_heal_s <= HANG_S, story  # no hang once the network healed
    assert not run.tracebacks, (run.tracebacks, story)


def test_a_producer_that_resends_under_a_new_seq_fails_the_nemesis(
    nemesis: Callable[..., NemesisRun],
) -> None:
    """The broken build re-sends a record not acknowledged within a second as a new record.
    The nemesis's one-way loss on the producers' link lets the first copies land while their
    acknowledgements are lost, so the event checker must find events appended twice. (The
    streaming sink is left out: this mutation does not touch it, the final pass reads all.)"""
    plan = FaultPlan.network(BROKEN_SEED, span_s=SPAN_S)
    assert plan.of_kind(FaultKind.ONE_WAY_LOSS), plan.describe()
    run = nemesis(BROKEN_SEED, live_sink=False, mutations=("resend-new-seq-on-timeout",))
    anomalies = run.outcome.anomalies()
    assert not run.outcome.report.ok, run.story()
    assert anomalies["event_duplicate"] > 0, (anomalies, run.story())
