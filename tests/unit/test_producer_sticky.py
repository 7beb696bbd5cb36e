"""Unkeyed records without a partition (sticky) replay to the partitions of the first run.

A resume re-sends the records after its checkpoint and relies on each getting the (partition,
seq) it had: the sticky position per topic and the number the first partition derives from are
stored in every checkpoint and restored by every resume, whatever pid continues.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from pidfence.producer import IdempotentProducer, ProducerCheckpoint
from tests.unit.producer_kit import LIFETIME, SharedRig, appended_by_rules

EVENTS = [b"e%d" % i for i in range(9)]


class StickyRig(SharedRig):
    """Resumed producers writing one Kafka log (sticky_records=3, topic ``t`` of 3
    partitions)."""

    def placed(self) -> dict[bytes, set[int]]:
        """The partitions each value went to (data records only)."""
        assert self.kafka is not None
        out: dict[bytes, set[int]] = {}
        for msg in self.kafka.log:
            if msg.value():
                out.setdefault(msg.value(), set()).add(msg.partition())
        return out

    def appended(self) -> Counter[bytes]:
        assert self.kafka is not None
        return Counter(appended_by_rules(self.kafka.log))


def crash_and_replay(expire: bool, stored_at: int) -> StickyRig:
    """First run: unkeyed e0.., a checkpoint stored after ``stored_at`` records, e.. e4 more,
    then a crash; the restart (after the lease ended when ``expire``) resumes the stored
    checkpoint and replays from its position to the end."""
    rig = StickyRig()
    first = rig.producer()
    for event in EVENTS[:stored_at]:
        first.produce("t", event)
    first.flush()
    cp = first.checkpoint()
    for event in EVENTS[stored_at:5]:
        first.produce("t", event)
    first.flush()
    if expire:
        rig.now += LIFETIME + 1
    resumed = rig.resume(cp, topics=["t"])  # as the copier and load generator name theirs
    assert resumed.resumed_how == ("rolled" if expire else "bumped")
    for event in EVENTS[stored_at:]:
        resumed.produce("t", event)
    resumed.flush()
    return rig


def test_a_replay_after_a_bumped_resume_goes_where_the_first_run_went() -> None:
    """The review's case: without the sticky position in the checkpoint the replay started
    afresh at ``pid % partitions``: e3, e4 appended twice, e5, e6 lost."""
    rig = crash_and_replay(expire=False, stored_at=2)
    assert all(len(parts) == 1 for parts in rig.placed().values()), rig.placed()
    assert rig.appended() == Counter(EVENTS)


def test_a_replay_under_the_successor_pid_goes_where_the_first_run_went() -> None:
    """A rolled resume continues under a new pid: the first partition still derives from the
    lineage's first pid, and the position is the checkpoint's."""
    rig = crash_and_replay(expire=True, stored_at=2)
    assert all(len(parts) == 1 for parts in rig.placed().values()), rig.placed()
    assert rig.appended() == Counter(EVENTS)


def test_a_topic_first_written_after_the_checkpoint_starts_where_the_first_run_started() -> None:
    rig = crash_and_replay(expire=True, stored_at=0)
    assert all(len(parts) == 1 for parts in rig.placed().values()), rig.placed()
    assert rig.appended() == Counter(EVENTS)


@pytest.mark.parametrize("many", [False, True], ids=["produce", "produce_many"])
def test_the_checkpoint_of_a_rollover_that_comes_between_a_pick_and_its_send(many: bool) -> None:
    """The stamping loop picks an unkeyed record's partition, finds it not ready, and the
    general path then rolls over (the clock passed the rollover point in between): the
    successor's checkpoint, stored with this record's position, is the position before the
    pick, so a replay from it picks the same partitions for the same records."""
    rig = StickyRig()
    rig.config = replace(rig.config, resend_buffer=0)  # untracked: stamped inline when ready
    saved: list[ProducerCheckpoint] = []
    first: IdempotentProducer = rig.producer(on_roll=saved.append)
    events = [b"r%d" % i for i in range(12)]

    def send(producer: IdempotentProducer, batch: list[bytes]) -> None:
        if many:
            producer.produce_many("t", batch)
        else:
            for event in batch:
                producer.produce("t", event)

    send(first, events[:6])
    pick = first._partitioner.pick

    def pick_then_time_passes(topic: str, key: Any, pid: int) -> int:
        partition = pick(topic, key, pid)
        rig.now = first.sequencer.expire_ms - 1  # past the rollover point, inside the lease
        return partition

    first._partitioner.pick = pick_then_time_passes  # type: ignore[method-assign]
    first._stamper.pick = pick_then_time_passes
    send(first, events[6:7])
    assert first.rollovers == 1 and len(saved) == 1
    first._partitioner.pick = first._stamper.pick = pick  # type: ignore[method-assign]
    send(first, events[7:])
    first.flush()
    assert len({p for v, (p,) in rig.placed().items() if v in events[5:7]}) == 2  # it moved on
    resumed = rig.resume(saved[0])  # stored with the position of events[6]
    send(resumed, events[6:])
    resumed.flush()
    assert all(len(parts) == 1 for parts in rig.placed().values()), rig.placed()
    assert rig.appended() == Counter(events)


def test_sticky_positions_survive_the_checkpoints_json_and_older_checkpoints_have_none() -> None:
    cp = ProducerCheckpoint(7, 3, 10**9, {("t", 1): 4}, sticky={"t": (1, 2)}, sticky_seed=5)
    data = cp.to_dict()
    assert data["v"] == 3 and data["sticky"] == [["t", 1, 2]] and data["sticky_seed"] == 5
    assert ProducerCheckpoint.from_dict(data) == cp
    older = {k: v for k, v in data.items() if k not in ("sticky", "sticky_seed")} | {"v": 1}
    assert ProducerCheckpoint.from_dict(older).sticky == {}
    plain = ProducerCheckpoint(7, 3, 10**9, sticky_seed=7)  # the seed is the pid: not written
    assert "sticky_seed" not in plain.to_dict() and plain.to_dict()["v"] == 1
