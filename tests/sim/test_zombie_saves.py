"""Zombies that keep storing their periodic checkpoints (``Knobs.zombie_saves``).

A single process with a state file (``pidfence copy --state``, ``pidfence produce --state``)
stores its checkpoint every interval. A zombie (paused, then woken after a resume replaced it)
does too: were its store accepted, the state would hold a position past records the sink
``FENCED``, and the next resume from it would never send their events again. The world: every
instance of a chain stores into the chain's one state, zombies included; the real producer's
``checkpoint()`` must refuse a replaced instance (``ProducerFenced``: it asks the real lease
service). A checkpoint that does not ask loses events in these schedules.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import strategies as st

from pidfence.producer.lease import LeaseKeeper
from pidfence.sim import SimResult, run
from pidfence.sim.client import SimStuck
from tests.sim.schedules import CRASHING_PAIR, assert_clean, knob_space, walk_shard

#: Zombies that wake after their replacement took over and store their checkpoints.
ZOMBIE_SAVES = {
    **CRASHING_PAIR,
    "pause_p": 0.5,
    "zombie_saves": True,
    "lifetime_ms": 10**8,
    "checkpoint_every": 4,
}
SEED_RANGE = range(8)
#: Drawn schedules of this world (``PIDFENCE_SIM_EXAMPLES`` overrides, as for the main space).
EXAMPLES = int(os.environ.get("PIDFENCE_SIM_EXAMPLES", "120"))
SHARDS = 2
#: The derandomized schedules' seed (fixed, so editing this file keeps the same schedules).
SCHEDULES_SEED = 20_260_611


@pytest.fixture(scope="module")
def saving() -> list[SimResult]:
    return [run(seed, **ZOMBIE_SAVES) for seed in SEED_RANGE]


def test_every_schedule_where_zombies_store_checkpoints_is_exactly_once(
    saving: list[SimResult],
) -> None:
    for result in saving:
        assert_clean(result)


@pytest.mark.parametrize(
    "stat",
    [
        "zombie_saves",  # a zombie nobody replaced yet stored its checkpoint (still the owner)
        "zombie_saves_refused",  # a replaced one was refused: ProducerFenced, it exited
        "lease_confirmed",  # the checkpoints asked the lease servers
        "verdict_FENCED",  # the replaced zombies' records were fenced
    ],
)
def test_fault_happens(saving: list[SimResult], stat: str) -> None:
    assert sum(r.stats.get(stat, 0) for r in saving) > 0, [r.stats.get(stat) for r in saving]


def test_a_checkpoint_that_does_not_ask_the_lease_servers_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the ownership question a replaced zombie's store wins: its position covers
    records the sink fenced (events lost), or names a generation its lineage has moved past
    (the only resumer is refused: nobody can continue)."""
    monkeypatch.setattr(LeaseKeeper, "confirm", lambda self, current: None)
    caught = 0
    for seed in SEED_RANGE:
        try:
            result = run(seed, **ZOMBIE_SAVES)
        except SimStuck:
            caught += 1
            continue
        if not (result.ok and result.exactly_once and result.oracle.ok):
            assert result.report.findings["event_lost"].count > 0, result.describe()
            caught += 1
    assert caught >= 2


def bounded_outages(knobs: dict[str, Any]) -> dict[str, Any]:
    """Outages last up to a quarter of a lease lifetime, and nothing finishes during one (a
    process's last save waits for a lease server, as its rerun would): with the longest leases
    that is more steps than a schedule may take, so outages come with shorter ones."""
    if knobs["lease_down_p"] and knobs["lifetime_ms"] > 10_000:
        return {**knobs, "lifetime_ms": 10_000}
    return knobs


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_drawn_schedule_with_saving_zombies_is_exactly_once(shard: int) -> None:
    # Lease server outages too: a checkpoint nobody could confirm is skipped, not stored.
    space = knob_space(zombie_saves=st.just(True), lease_down_p=st.sampled_from([0.0, 0.01])).map(
        bounded_outages
    )
    walk_shard(shard, SHARDS, space, EXAMPLES, SCHEDULES_SEED)


def test_an_acknowledged_zombie_copy_of_an_event_owed_only_before_the_sinks_start() -> None:
    """A resume wrote an event under the bumped generation, unacknowledged, before a sink that
    starts at the latest offsets began; the paused zombie then wrote it again under the old
    generation, acknowledged, and the sink FENCED that copy as the strict rules do. The event
    is owed only at offsets the sink never read (the oracle's named losses), but the checker
    matched the zombie's acknowledgement and called the event lost (found by the exploration
    run: ``PIDFENCE_SIM_EXPLORE=1 PIDFENCE_SIM_EXAMPLES=1500``)."""
    knobs: dict[str, Any] = {
        "events": 157,
        "partitions": 4,
        "producers": 1,
        "drop_p": 0.5,
        "dup_p": 0.5,
        "reorder": 1,
        "crash_p": 0.1,
        "zombie_p": 1.0,
        "pause_p": 1.0,
        "down_p": 0.1,
        "double_p": 0.0,
        "restart_p": 0.0,
        "plain_p": 0.0,
        "timeout_p": 0.01,
        "sink_start": 30,
        "sink_latest": True,
        "trim_p": 0.05,
        "resend_p": 0.01,
        "lifetime_ms": 3000,
        "step_ms": 20,
        "checkpoint_every": 2,
        "batch_every": 3,
        "zombie_saves": True,
    }
    result = run(1492687, **knobs)
    assert_clean(result)
    assert result.oracle.named_losses
