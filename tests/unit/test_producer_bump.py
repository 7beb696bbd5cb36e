"""``IdempotentProducer.bump()`` (a copier group's proof before each commit) and
``resume(partitions=...)`` (a copy task FENCEs and scans its one output partition)."""

from __future__ import annotations

import pytest

from pidfence.producer import LeaseState, NotFlushed, ProducerFenced
from pidfence.wire import FLAG_FENCE
from tests.unit.test_producer_lineage import SharedRig, exactly_once, send, z


@pytest.fixture
def rig() -> SharedRig:
    return SharedRig()


def test_a_bump_moves_the_generation_and_keeps_the_seqs(rig: SharedRig) -> None:
    producer = rig.producer()
    send(producer, 0, 6)
    before = producer.checkpoint()
    after = producer.bump()
    assert (after.pid, after.generation) == (before.pid, before.generation + 1)
    assert after.next_seq == before.next_seq and producer.state is LeaseState.LEASED
    send(producer, 6, 12)  # under the new generation
    exactly_once(rig, 12)


def test_generations_whose_records_were_all_duplicates_still_reach_the_rules(
    rig: SharedRig,
) -> None:
    """A resumer re-sends what its predecessor got in after the checkpoint: the rules drop the
    re-sends as ``DUPLICATE``, which moves no generation. Two bumps over such re-sends would put
    the next new record two generations ahead (``INVALID_GENERATION``, lost) were each bump not
    FENCEd on every partition the pid wrote."""
    first = rig.producer()
    send(first, 0, 3)
    checkpoint = first.checkpoint()
    send(first, 3, 12)  # in Kafka, then the owner dies before its next checkpoint
    resumed = rig.resume(checkpoint)
    for start in (3, 6):
        send(resumed, start, start + 3)  # re-sends: DUPLICATE on every partition
        resumed.bump()
    send(resumed, 9, 15)  # three re-sends, then new records
    exactly_once(rig, 15)
    fences = [m for m in rig.log if dict(m.headers())["pf"][-1] == FLAG_FENCE]
    assert len(fences) == 3 * 3  # the resume's, then one per partition at each bump


def test_a_bump_is_refused_once_another_owner_moved_the_pid_and_nothing_more_is_sent(
    rig: SharedRig,
) -> None:
    owner = rig.producer()
    send(owner, 0, 3)
    rig.resume(owner.checkpoint())  # someone else resumed (bumped) the pid
    with pytest.raises(ProducerFenced):
        owner.bump()
    assert owner.state is LeaseState.FENCED
    with pytest.raises(ProducerFenced):
        owner.produce("t", b"late", partition=0)


def test_a_bump_with_records_in_flight_is_refused(rig: SharedRig) -> None:
    producer = rig.producer()
    producer.produce("t", z(0), partition=0)  # not acknowledged until a poll or flush
    with pytest.raises(NotFlushed):
        producer.bump()


def test_a_resume_restricted_to_one_partition_fences_and_scans_only_it(rig: SharedRig) -> None:
    producer = rig.producer()
    for i in range(3):
        producer.produce("t", z(i), partition=1)
    producer.flush()
    scanned: list[object] = []

    def scan(state: object, partitions: object, since_ms: int, until: object) -> None:
        scanned.append(sorted(partitions))  # type: ignore[call-overload]

    resumed = rig.resume(producer.checkpoint(), partitions=[("t", 1)], scanner=scan)
    fences = [m for m in rig.log if dict(m.headers())["pf"][-1] == FLAG_FENCE]
    assert [(m.topic(), m.partition()) for m in fences] == [("t", 1)]
    assert scanned == [[("t", 1)]]
    resumed.produce("t", z(3), partition=1)
    resumed.flush()
    exactly_once(rig, 4)
