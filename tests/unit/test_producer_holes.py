"""Timeout holes and rollovers: a successor sends the seqs the sink skipped as a gap.

librdkafka times records out in its queue while later ones are written (a hole the sink reports
as a gap and keeps open). A resume under the same pid re-sends them and fills the hole; a resume
that rolls to a successor pid skips what its predecessor got into Kafka, and must not skip the
hole's events with it (they are in no output: docs/gaps.md). Judged per event by the sink's own
rules, gap resolution on.
"""

from __future__ import annotations

from collections import Counter

import pytest

from pidfence.broker_plugin import ProducerStateTable
from pidfence.producer import IdempotentProducer, ProducerCheckpoint
from pidfence.producer.checkpoint import BadCheckpoint
from pidfence.producer.recovery import after_pid
from pidfence.producer.sequencer import Sequencer
from pidfence.wire import decode_pf
from tests.unit.producer_kit import LIFETIME
from tests.unit.test_producer_lineage import ROLL_AT, SharedRig, z

TP = ("t", 0)


@pytest.fixture
def rig() -> SharedRig:
    return SharedRig()


def sink_appends(rig: SharedRig) -> Counter[bytes]:
    """Values the sink's rules (gap resolution on) append from the shared log."""
    table = ProducerStateTable(64, LIFETIME * 2, resolve_gaps=True)
    out: Counter[bytes] = Counter()
    for msg in rig.log:
        pf = decode_pf(dict(msg.headers())["pf"])
        decided = table.offer(pf.pid, pf.generation, pf.seq, 1, flags=pf.flags, ref=msg)
        out.update(d.ref.value() for d in decided if d.verdict.appended)
    return out


def send(producer: IdempotentProducer, first: int, last: int) -> None:
    for i in range(first, last):
        producer.produce("t", z(i), partition=0, event_id=f"z{i}")
    producer.flush()


def timed_out(rig: SharedRig, *events: int) -> None:
    """Take ``events`` out of the log: librdkafka timed them out in its queue, unwritten,
    while the records behind them went on (the test then plays the producer that died)."""
    rig.log[:] = [m for m in rig.log if m.value() not in {z(i) for i in events}]


def checkpoint_then_a_hole(rig: SharedRig, *events: int) -> ProducerCheckpoint:
    """A producer checkpoints after z0..z2, then writes z3..z14 but for ``events`` (timed out
    in librdkafka's queue: the eight or more records behind them make the sink report a gap),
    and dies; returns its checkpoint."""
    a = rig.producer()
    send(a, 0, 3)
    cp = a.checkpoint()
    send(a, 3, 15)
    timed_out(rig, *events)
    return cp


def test_a_resume_that_rolls_sends_the_hole_and_skips_the_rest(rig: SharedRig) -> None:
    cp = checkpoint_then_a_hole(rig, 5, 6)
    rig.now = cp.expire_ms + 1  # the lease ended while A was down: the resume rolls
    b = rig.resume(cp)
    assert b.resumed_how == "rolled"
    send(b, 3, 20)
    assert b.skipped == 10  # z3, z4 and z7..z14; z5 and z6 go out under the successor
    assert sink_appends(rig) == Counter(z(i) for i in range(20))


def test_a_roll_before_the_resends_hands_the_hole_over(rig: SharedRig) -> None:
    saved: list[ProducerCheckpoint] = []
    cp = checkpoint_then_a_hole(rig, 5)
    b = rig.resume(cp, on_roll=saved.append)  # the same pid: it would fill the hole itself
    assert b.sequencer.ahead_holes == {TP: [(5, 5)]}
    rig.now += ROLL_AT  # but it rolls before its first re-send
    b.produce("t", z(3), partition=0, event_id="z3")
    after_roll = saved[-1]
    assert after_roll.skip == {TP: 12} and after_roll.resend == {TP: ((10, 10),)}
    c = rig.resume(ProducerCheckpoint.from_json(after_roll.to_json()))  # died after the roll
    send(c, 3, 20)
    assert sink_appends(rig) == Counter(z(i) for i in range(20))


def rolled_past_a_hole(rig: SharedRig) -> IdempotentProducer:
    """A successor that rolled over a checkpoint with z5, z6 in a hole, and sent z3..z5."""
    cp = checkpoint_then_a_hole(rig, 5, 6)
    rig.now = cp.expire_ms + 1
    b = rig.resume(cp)
    assert b.resumed_how == "rolled"
    send(b, 3, 6)  # z3, z4 skipped; z5 sent, the first position of the two to send
    return b


def exactly_once(rig: SharedRig, n: int) -> None:
    got = sink_appends(rig)
    assert got == Counter(z(i) for i in range(n)), {k: v for k, v in got.items() if v != 1}


def test_a_roll_inside_a_resend_range_sends_the_rest_of_it(rig: SharedRig) -> None:
    b = rolled_past_a_hole(rig)
    rig.now += ROLL_AT  # the successor's own rollover falls now: z6 goes to the next pid
    send(b, 6, 20)
    exactly_once(rig, 20)


@pytest.mark.parametrize("expired", [False, True], ids=["bumped", "rolled"])
def test_a_checkpoint_inside_a_resend_range_resumes_where_it_was(
    rig: SharedRig, expired: bool
) -> None:
    """Found by review: a taken resend position stayed in the plan, so a checkpoint inside a
    range sent z5 again after a roll, or dropped z6 after a bump."""
    b = rolled_past_a_hole(rig)
    mid = b.checkpoint()
    assert mid.resend == {TP: ((9, 9),)}  # z6 is still to send; z5 is not
    send(b, 6, 7)  # z6 sent, then the successor dies
    rig.now = mid.expire_ms + 1 if expired else rig.now
    c = rig.resume(ProducerCheckpoint.from_json(mid.to_json()))
    assert c.resumed_how == ("rolled" if expired else "bumped")
    send(c, 6, 20)
    exactly_once(rig, 20)


@pytest.mark.parametrize("successors_hole", [(), (6,), (16, 17)])
def test_a_bumped_resume_mid_plan_then_a_roll(
    rig: SharedRig, successors_hole: tuple[int, ...]
) -> None:
    b = rolled_past_a_hole(rig)
    mid = b.checkpoint()
    send(b, 6, 25)  # z6, then z15.. under the successor
    timed_out(rig, *successors_hole)  # the successor's own records may leave a hole too
    c = rig.resume(ProducerCheckpoint.from_json(mid.to_json()))
    assert c.resumed_how == "bumped"
    rig.now += ROLL_AT  # it rolls before its first re-send
    send(c, 6, 30)
    exactly_once(rig, 30)


def test_a_full_queue_on_a_position_to_send_keeps_its_place(rig: SharedRig) -> None:
    """Found by review: the position was taken before the record reached the client, so the
    retry after ``QueueFull`` landed on the next one (z6 lost, z14 sent twice)."""
    cp = checkpoint_then_a_hole(rig, 5, 6)
    rig.now = cp.expire_ms + 1
    b = rig.resume(cp)
    send(b, 3, 5)
    assert rig.kafka is not None
    rig.kafka.full_once = True  # librdkafka's queue is full once, for z5
    send(b, 5, 20)
    exactly_once(rig, 20)


def test_a_skip_run_sends_its_resend_positions_in_order() -> None:
    seq = Sequencer(7, 0, 10**9).with_skip({TP: 3}, {TP: [(2, 2)]})
    seq.with_skip({TP: 2}, {TP: [(1, 1)]})  # a second run after the first
    assert seq.resend == {TP: [(4, 4), (1, 1)]}
    assert [seq.take_skip(*TP) for _ in range(6)] == [True, False, True, True, False, False]
    assert seq.skip == {} and seq.resend == {}


def test_after_a_pid_its_delivered_resends_are_skipped_and_its_gaps_sent() -> None:
    runs = [(4, [(4, 3)])]  # skip 4 records but send the first two
    # The pid sent those two as its seqs 0 and 1, then two more after the run.
    assert after_pid(runs, 0, 4, []) == [(4, []), (2, [])]
    # Its seq 1 never reached Kafka (a gap): that resend is still owed.
    assert after_pid(runs, 0, 4, [(1, 1)]) == [(4, [(3, 3)]), (2, [])]
    # A gap after the run is a record of the last run sent anyway.
    assert after_pid(runs, 0, 5, [(3, 3)]) == [(4, []), (3, [(2, 2)])]


def test_a_checkpoint_keeps_the_plan_and_refuses_a_damaged_one() -> None:
    seq = Sequencer(7, 0, 10**9).with_skip({TP: 5}, {TP: [(4, 3)]})
    seq.ahead, seq.ahead_holes = {TP: 9}, {TP: [(6, 6)]}
    cp = seq.checkpoint()
    again = ProducerCheckpoint.from_json(cp.to_json())
    assert again.resend == {TP: ((4, 3),)} and again.ahead_holes == {TP: ((6, 6),)}
    # Version 2 only with a plan: an older pidfence refuses it rather than skip the holes.
    assert cp.to_dict()["v"] == 2 and Sequencer(7, 0, 10**9).checkpoint().to_dict()["v"] == 1
    unordered, overlapping, negative, past_the_run = (
        [["t", 0, ranges]] for ranges in ([[3, 4], [2, 2]], [[4, 3], [3, 1]], [[-1, 1]], [[9, 9]])
    )
    for bad in (unordered, overlapping, negative, past_the_run):
        with pytest.raises(BadCheckpoint):
            ProducerCheckpoint.from_dict(cp.to_dict() | {"resend": bad})
    with pytest.raises(BadCheckpoint):
        ProducerCheckpoint.from_dict(cp.to_dict() | {"ahead_holes": [["t", 0, [[9, 9]]]]})
