"""Copier groups under faults: members killed, paused, woken as zombies, added and removed while
an upstream producer writes. The real sink runs over the output topic; the event-level checker
judges the members' ledgers, and every upstream event must be in the output exactly once, in
its input order.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pidfence.demo.copier_group import CopierGroup, GroupFaults, run_with_faults
from pidfence.demo.procs import ProducerRole, ProducerSpec
from pidfence.demo.summary import copier_exactly_once
from pidfence.demo.topic import read_topic
from pidfence.testing import FaultKind, FaultPlan, step
from tests.chaos.conftest import ChaosKit, Outcome

pytestmark = pytest.mark.timeout(420)

PARTITIONS = 4
RECORDS = 3000
RATE = 150.0
SESSION_S = 6
MEMBER_ARGS = (
    "--session-timeout",
    str(SESSION_S),
    "--idle-exit",
    "8",
    "--checkpoint-every",
    "50",
    "--message-timeout",
    "5s",
)


def _run(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server: Any, plan: FaultPlan, **first: Any
) -> tuple[CopierGroup, GroupFaults, str, str]:
    """Upstream writes RECORDS at RATE; members ``first`` (name -> extra args) start, ``plan``
    runs; returns once every process exited."""
    source, target = new_topic(partitions=PARTITIONS), new_topic(partitions=PARTITIONS)
    spec = ProducerSpec(
        "up",
        kafka.bootstrap,
        lease_server.address,
        source,
        RECORDS,
        chaos.tmp / "up.json",
        rate=RATE,
        extra=("--message-timeout", "5s"),
    )
    upstream = ProducerRole(spec, chaos.tmp / "upstream-ledgers", chaos.logs)
    group = CopierGroup(
        kafka.bootstrap, lease_server.address, source, target, f"g-{source}", chaos.tmp, MEMBER_ARGS
    )
    faults = GroupFaults(group, plan, total=RECORDS)
    codes = run_with_faults(group, upstream, faults, first, drive_s=240, wait_s=180)
    assert faults.happened, faults.events
    failed = {w.name: w.tail() for w in group.workers if w.fate is None and codes[w.name] != 0}
    assert not failed, failed
    return group, faults, source, target


def _assert_exact(kafka: Any, source: str, outcome: Outcome) -> None:
    """Zero anomalies; every upstream event once in the output, in input order per partition."""
    outcome.assert_clean()
    exact = copier_exactly_once(read_topic(kafka.bootstrap, source), outcome.log)
    assert exact == {"upstream": RECORDS, "copied_once": RECORDS, "missing": 0, "duplicated": 0}
    log = outcome.log.sort_by([("partition", "ascending"), ("log_offset", "ascending")])
    order: dict[int, list[int]] = {}
    for partition, value in zip(
        log.column("partition").to_pylist(), log.column("value").to_pylist(), strict=True
    ):
        order.setdefault(partition, []).append(json.loads(value)["i"])
    assert all(seen == sorted(seen) for seen in order.values()), "reordered"


def test_a_member_paused_past_its_session_is_a_zombie_and_its_late_records_are_fenced(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server: Any, spark: Any
) -> None:
    """z stops itself (SIGSTOP) right before copying a record, past its session timeout; the
    group hands its partitions to a, which resumes them (bump + FENCE). z is woken only once
    a FENCEd the partition z was about to copy: z sends that record (and whatever else it had
    fetched) under its old generation, and the sink refuses them as ``FENCED``; its next bump is
    refused, so it commits none of them. z rejoins and ends like the others; c joins after."""
    plan = FaultPlan(
        (
            step(FaultKind.ZOMBIE, "z", duration_s=SESSION_S + 2),
            step(FaultKind.JOIN, "c"),
        )
    )
    group, faults, source, target = _run(
        chaos,
        kafka,
        new_topic,
        lease_server,
        plan,
        a=(),
        z=("--stop-after-commit", "6"),
    )
    chaos.sink(spark, kafka.bootstrap, target)
    outcome = chaos.outcome()
    _assert_exact(kafka, source, outcome)
    assert outcome.verdicts["FENCED"] >= 1, (faults.events, outcome.verdicts)
    assert all(w.acked() for w in group.members["a"] + group.members["z"]), "a member idled"


def test_members_killed_paused_added_and_removed_leave_the_output_exact(
    chaos: ChaosKit, kafka: Any, new_topic: Any, lease_server: Any, spark: Any
) -> None:
    """a is SIGKILLed and restarted, b is paused past its session timeout and resumed, c joins
    and d leaves (SIGTERM: it commits and hands its partitions over)."""
    plan = FaultPlan(
        (
            step(FaultKind.KILL, "a", at_acked=0.15),
            step(FaultKind.JOIN, "c", at_acked=0.3),
            step(FaultKind.PAUSE, "b", at_acked=0.4, duration_s=SESSION_S + 3),
            step(FaultKind.LEAVE, "d", at_acked=0.7),
        )
    )
    group, faults, source, target = _run(
        chaos, kafka, new_topic, lease_server, plan, a=(), b=(), d=()
    )
    assert len(faults.events) >= 4, faults.events
    chaos.sink(spark, kafka.bootstrap, target)
    _assert_exact(kafka, source, chaos.outcome())
    assert group.current("d").exit_code() == 0
