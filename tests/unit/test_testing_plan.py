"""``pidfence.testing``'s plan: seeded and replayable, toxics per step, the simulation's knobs."""

from __future__ import annotations

import pytest

from pidfence.sim.knobs import Knobs
from pidfence.testing import (
    NETWORK_KINDS,
    BadFaultPlan,
    FaultKind,
    FaultPlan,
    Link,
    sim_knobs,
    step,
    unmapped,
)
from pidfence.testing.network import toxics_for


def test_the_same_seed_gives_the_same_plan_and_json_replays_it() -> None:
    plan = FaultPlan.network(42, span_s=20.0)
    assert plan == FaultPlan.network(42, span_s=20.0)
    assert plan != FaultPlan.network(43, span_s=20.0)
    assert FaultPlan.from_json(plan.to_json()) == plan
    assert plan.seed == 42


@pytest.mark.parametrize("seed", range(20))
def test_every_nemesis_hits_every_link_within_its_span_and_loses_replies_to_kafka(
    seed: int,
) -> None:
    plan = FaultPlan.network(seed, span_s=20.0)
    assert {Link(s.target) for s in plan.network_steps} == set(Link)
    assert all(s.kind in NETWORK_KINDS and s.at_s >= 0 and s.ends_s <= 20.0 for s in plan)
    losses = [s for s in plan.of_kind(FaultKind.ONE_WAY_LOSS) if s.target == Link.PRODUCER_KAFKA]
    assert any(s.duration_s >= 2.5 for s in losses)


def test_a_network_step_needs_a_link_and_bad_json_is_refused() -> None:
    with pytest.raises(BadFaultPlan, match="link"):
        step(FaultKind.LATENCY, "p0")
    with pytest.raises(BadFaultPlan):
        FaultPlan.from_json('{"steps": [{"kind": "explode", "target": "p0"}]}')
    with pytest.raises(BadFaultPlan, match="at_acked"):
        step(FaultKind.KILL, "p0", at_acked=1.5)


def test_each_network_kind_maps_to_the_toxics_its_name_promises() -> None:
    def toxics(kind: FaultKind, **params: int) -> list[tuple[str, str, dict[str, int]]]:
        fault = step(kind, Link.PRODUCER_KAFKA, duration_s=1, **params)
        return [(t.kind, t.stream, dict(t.attributes)) for t in toxics_for(fault)]

    assert toxics(FaultKind.ONE_WAY_LOSS) == [("timeout", "downstream", {"timeout": 0})]
    assert toxics(FaultKind.BLACKHOLE) == [
        ("timeout", "upstream", {"timeout": 0}),
        ("timeout", "downstream", {"timeout": 0}),
    ]
    assert toxics(FaultKind.LATENCY, latency_ms=100, jitter_ms=30)[0] == (
        "latency",
        "upstream",
        {"latency": 100, "jitter": 30},
    )
    assert toxics(FaultKind.RESET, timeout_ms=5) == [("reset_peer", "upstream", {"timeout": 5})]
    assert toxics(FaultKind.BANDWIDTH, rate_kbps=32) == [("bandwidth", "upstream", {"rate": 32})]
    assert toxics(FaultKind.SLICE, average_size=20, delay_us=7) == [
        ("slicer", "downstream", {"average_size": 20, "size_variation": 10, "delay": 7})
    ]
    with pytest.raises(ValueError, match="not a network fault"):
        toxics_for(step(FaultKind.KILL, "p0"))


def test_a_plan_turns_into_knobs_the_simulation_accepts() -> None:
    plan = FaultPlan(
        (
            step(FaultKind.KILL, "p0", at_acked=0.3),
            step(FaultKind.ZOMBIE, "p1", at_acked=0.4),
            step(FaultKind.ONE_WAY_LOSS, Link.PRODUCER_KAFKA, at_s=1, duration_s=2),
            step(FaultKind.LATENCY, Link.PRODUCER_KAFKA, at_s=1, duration_s=2, jitter_ms=50),
            step(FaultKind.BLACKHOLE, Link.LEASE_ZOOKEEPER, at_s=1, duration_s=2),
            step(FaultKind.SINK_CRASH, "sink", point="before_manifest"),
            step(FaultKind.RESET, Link.SINK_KAFKA, at_s=0, duration_s=1),
        )
    )
    knobs = sim_knobs(plan)
    Knobs(**knobs)  # valid keyword arguments
    assert knobs["crash_p"] > 0 and knobs["zombie_p"] > 0 and knobs["pause_p"] == 0
    assert knobs["dup_p"] > 0 and knobs["drop_p"] == 0 and knobs["reorder"] == 3
    assert knobs["down_p"] > 0 and knobs["restart_p"] > 0
    assert unmapped(plan) == []
    slow = FaultPlan((step(FaultKind.BANDWIDTH, Link.SINK_KAFKA, duration_s=1),))
    assert unmapped(slow) == list(slow)


def test_a_plan_without_faults_turns_every_fault_knob_off() -> None:
    knobs = sim_knobs(FaultPlan())
    Knobs(**knobs)
    assert all(v == 0 for k, v in knobs.items() if k.endswith("_p"))
    assert knobs["reorder"] == 1


@pytest.mark.parametrize("seed", [1, 2])
def test_the_simulation_runs_what_a_plan_asks_for_and_finds_nothing(seed: int) -> None:
    from pidfence.demo.config import DemoConfig, Fault
    from pidfence.sim import run

    for plan in (FaultPlan.network(seed), DemoConfig(faults=frozenset(Fault), seed=seed).plan):
        result = run(seed, **sim_knobs(plan))
        assert result.report.ok, (plan.describe(), result.report)
