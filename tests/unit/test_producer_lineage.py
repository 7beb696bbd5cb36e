"""Rollover and resume through the lineage (DESIGN §9), judged per event by the broker rules.

One fake Kafka log is shared by every producer instance, and the log is replayed through the
real broker rules (``ProducerStateTable``) per partition: each scenario must end with every
event appended exactly once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import ProducerStateTable
from pidfence.producer import (
    DrainFailed,
    IdempotentProducer,
    LeaseState,
    ProducerCheckpoint,
    ProducerFenced,
)
from pidfence.producer.recovery import scan_state
from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, decode_pf, encode_pf
from pidfence.wire.cert import CERT_HEADER_KEY
from tests.unit.producer_kit import LIFETIME, FakeKafka, Rig

ROLL_AT = LIFETIME * 23 // 24


class SharedRig(Rig):
    """Every producer writes to one Kafka log (as real instances of one pipeline do)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Any] = []
        self.offsets: dict[tuple[str, int], int] = {}

    def factory(self, conf: dict[str, Any]) -> FakeKafka:
        kafka = super().factory(conf)
        kafka.log, kafka.offsets = self.log, self.offsets
        return kafka

    def appended(self) -> Counter[bytes]:
        """Values the broker rules append, replaying the shared log per partition."""
        tables: dict[tuple[str, int], ProducerStateTable] = {}
        out: Counter[bytes] = Counter()
        for msg in self.log:
            tp = (msg.topic(), msg.partition())
            table = tables.setdefault(tp, ProducerStateTable(64, LIFETIME * 2))
            pf = decode_pf(dict(msg.headers())["pf"])
            refs = table.offer(pf.pid, pf.generation, pf.seq, 1, flags=pf.flags, ref=msg)
            out.update(d.ref.value() for d in refs if d.verdict.appended)
        return out


@pytest.fixture
def rig() -> SharedRig:
    return SharedRig()


def z(i: int) -> bytes:
    return b"z%d" % i


def send(producer: IdempotentProducer, first: int, last: int) -> None:
    for i in range(first, last):
        producer.produce("t", z(i), partition=i % 3, event_id=f"z{i}")
    producer.flush()


def exactly_once(rig: SharedRig, n: int) -> None:
    assert rig.appended() == Counter(z(i) for i in range(n))


def test_scenario_1_zombie_past_its_rollover_is_fenced(rig: SharedRig) -> None:
    a = rig.producer()
    send(a, 0, 10)
    cp = a.checkpoint()
    b = rig.resume(cp)  # bump + FENCE while A is paused
    send(b, 10, 20)
    rig.now += ROLL_AT  # A wakes after its rollover point and would re-send z10..z19
    with pytest.raises(ProducerFenced, match="could not roll over"):
        a.produce("t", z(10), partition=1)
    assert a.state is LeaseState.FENCED
    with pytest.raises(ProducerFenced, match="FENCED"):
        a.produce("t", z(11), partition=2)
    exactly_once(rig, 20)


def test_scenario_2_zombie_past_its_expiry_is_fenced(rig: SharedRig) -> None:
    a = rig.producer()
    send(a, 0, 10)
    cp = a.checkpoint()
    rig.now = cp.expire_ms + 1  # A's lease ended before B resumes
    b = rig.resume(cp)
    assert b.resumed_how == "rolled" and b.sequencer.pid != cp.pid
    send(b, 10, 20)
    with pytest.raises(ProducerFenced):
        a.produce("t", z(10), partition=1)
    with pytest.raises(ProducerFenced):
        a.roll()  # the state machine refuses before the lease server is asked
    exactly_once(rig, 20)


def test_two_resumers_of_one_expired_checkpoint_cannot_both_continue(rig: SharedRig) -> None:
    a = rig.producer()
    send(a, 0, 6)
    cp = a.checkpoint()
    rig.now = cp.expire_ms + 1
    b = rig.resume(cp)
    send(b, 6, 9)
    c = rig.resume(cp)  # follows the lineage: bumps B's pid with the checkpoint's secret
    assert c.resumed_how == "followed" and c.sequencer.pid == b.sequencer.pid
    assert c.sequencer.generation == b.sequencer.generation + 1
    send(c, 6, 12)  # re-sends z6..z8 under the same (pid, partition, seq): deduplicated
    send(b, 9, 12)  # B does not know yet: its records are fenced
    rig.now += ROLL_AT
    with pytest.raises(ProducerFenced):
        b.roll()
    exactly_once(rig, 12)


def test_crash_between_roll_and_save_resumes_at_the_roll_point(rig: SharedRig) -> None:
    saved: list[ProducerCheckpoint] = []
    a = rig.producer(on_roll=saved.append)
    send(a, 0, 5)
    rig.now += ROLL_AT
    cp = a.checkpoint()
    send(a, 5, 8)  # rolls before z5 (drained), then saves the successor's checkpoint
    assert [c.pid for c in saved] == [101] and dict(saved[0].next_seq) == {}
    # Killed after the roll but before the save: the store holds the checkpoint at z5.
    heir = rig.resume(cp)
    assert heir.resumed_how == "followed" and heir.sequencer.pid == 101
    send(heir, 5, 10)
    exactly_once(rig, 10)


def rolled_after_an_old_checkpoint(
    rig: SharedRig, last: int
) -> tuple[IdempotentProducer, ProducerCheckpoint]:
    """The owner checkpoints at z3, sends z3..z5, rolls over at z6, sends z6..z{last-1}."""
    a = rig.producer()
    send(a, 0, 3)
    old = a.checkpoint()
    send(a, 3, 6)
    rig.now += ROLL_AT
    a.roll()
    send(a, 6, last)
    return a, old


def test_older_checkpoint_after_the_owner_rolled_lines_up_with_the_successor(
    rig: SharedRig,
) -> None:
    # A resumer of an older checkpoint (z3) while the owner went on and rolled at z6: it follows
    # the lineage, skips z3..z5 (in Kafka under the old pid), re-sends z6.. under the successor's
    # seqs (deduplicated) and fences the owner.
    a, old = rolled_after_an_old_checkpoint(rig, 9)
    b = rig.resume(old)
    assert b.resumed_how == "followed" and sum(b.sequencer.skip.values()) == 3
    send(b, 3, 12)
    send(a, 9, 12)  # fenced
    exactly_once(rig, 12)


def test_failed_drain_raises_and_sends_nothing_under_a_new_pid(rig: SharedRig) -> None:
    a = rig.producer()
    a.produce("t", z(0), partition=0)
    assert rig.kafka is not None
    rig.kafka.stuck = True
    rig.now += ROLL_AT
    with pytest.raises(DrainFailed) as info:
        a.produce("t", z(1), partition=0)
    assert info.value.retriable
    assert a.state is LeaseState.LEASED and "roll 100 40" not in rig.lease.calls
    assert {decode_pf(dict(m.headers())["pf"]).pid for m, _ in rig.kafka.pending} == {100}


def test_cert_is_stamped_on_fences_and_first_record_per_partition_and_after_a_roll(
    rig: SharedRig,
) -> None:
    rig.lease.sign = True
    a = rig.producer()
    send(a, 0, 6)
    cp = a.checkpoint()
    b = rig.resume(cp)
    send(b, 6, 9)
    rig.now += ROLL_AT
    b.roll()
    send(b, 9, 12)

    def certs(msg: Any) -> list[bytes]:
        return [v for k, v in msg.headers() if k == CERT_HEADER_KEY]

    stamped = [(decode_pf(dict(m.headers())["pf"]), certs(m)) for m in rig.log]
    for pf, cert in stamped:
        if pf.flags & FLAG_FENCE:
            assert cert == [b"cert-%d-%d" % (pf.pid, pf.generation)]
    firsts: dict[tuple[int, int, int], int] = Counter()
    for msg, (pf, cert) in zip(rig.log, stamped, strict=True):
        if pf.flags & FLAG_FENCE:
            continue
        key = (pf.pid, pf.generation, msg.partition())
        firsts[key] += 1
        assert cert == ([b"cert-%d-%d" % (pf.pid, pf.generation)] if firsts[key] == 1 else [])
    # Three (pid, generation)s wrote data on three partitions each.
    assert len(firsts) == 9


def test_resumer_past_the_rollover_point_skips_what_its_predecessor_got_in(
    rig: SharedRig,
) -> None:
    # A checkpoints at z5, gets z5..z9 acknowledged, dies. B resumes after the rollover point:
    # it rolls at once, so z5..z9 would go out under the successor, where nothing deduplicates
    # them. The recovery scan finds them in Kafka under A's pid: B skips them.
    a = rig.producer()
    send(a, 0, 5)
    cp = a.checkpoint()
    send(a, 5, 10)
    rig.now += ROLL_AT
    b = rig.resume(cp)
    # z5..z9 went to partitions 2, 0, 1, 2, 0: the next seqs after them under A's pid.
    assert b.sequencer.ahead == {("t", 0): 4, ("t", 1): 3, ("t", 2): 3}
    send(b, 5, 14)
    assert b.rollovers == 1 and b.skipped == 5
    exactly_once(rig, 14)


def test_skips_survive_a_crash_after_the_roll(rig: SharedRig) -> None:
    saved: list[ProducerCheckpoint] = []
    a = rig.producer()
    send(a, 0, 5)
    cp = a.checkpoint()
    send(a, 5, 10)
    rig.now += ROLL_AT
    b = rig.resume(cp, on_roll=saved.append)
    b.produce("t", z(5), partition=5 % 3, event_id="z5")  # rolls, then skips z5
    after_roll = saved[-1]  # stored with the position before z5
    assert after_roll.pid == 101 and sum(after_roll.skip.values()) == 5
    c = rig.resume(after_roll)  # B died right after the roll
    send(c, 5, 12)
    exactly_once(rig, 12)


def test_scan_starts_above_the_checkpoints_ahead_as_the_rules_do() -> None:
    # Sim seed 23294 (tests/sim): a resume found seq 0 of pid P under generation 10 (before the
    # next checkpoint's taken_ms) and stored ahead = 1 with next_seq empty; its instance then got
    # seq 1 appended under generation 11 and died. The next resume scans from that checkpoint's
    # taken_ms: it must start from ahead, or seq 1 looks held behind a gap, its own FENCE at
    # generation 12 "fences" it, and the event is re-sent under the successor: twice in the log.
    tp = ("t", 0)
    cp = ProducerCheckpoint(7, 11, 10**9, taken_ms=100, ahead={tp: 1})
    before = [encode_pf(7, 10, 0)]  # older than taken_ms: outside the scan
    fence, data = FLAG_FENCE, 0
    scanned = [encode_pf(7, 11, 0, fence), encode_pf(7, 11, 1, data), encode_pf(7, 12, 2, fence)]
    rules = ProducerStateTable(8, LIFETIME)
    verdicts = [d.verdict.value for h in before + scanned for d in rules.offer_header(h, 0)]
    assert verdicts == ["APPENDED", "FENCE", "APPENDED", "FENCE"]
    state = scan_state(cp, 8)
    for h in scanned:
        state.note(tp, [(PF_HEADER_KEY, h)])
    assert state.highs[7] == {tp: 1}


OPS = st.lists(st.sampled_from(["data", "dup", "fence"]), max_size=12)
SUFFIX_OPS = st.lists(st.sampled_from(["data", "data", "dup", "drop", "fence"]), max_size=25)


@settings(max_examples=300, deadline=None)
@given(prefix=OPS, suffix=SUFFIX_OPS, known=st.sampled_from(["next_seq", "ahead", "both"]))
def test_scan_from_a_checkpoint_finds_what_the_rules_appended(
    prefix: list[str], suffix: list[str], known: str
) -> None:
    # One pid on one partition: everything before the checkpoint's taken_ms is fed to the rules
    # only; the checkpoint then knows the rules' highwater (as next_seq, as an earlier scan's
    # ahead, or both) and generation; the scan of the rest must end at the rules' highwater.
    pid, tp, gen, nxt = 7, ("t", 0), 5, 1
    # The sink's rules, gap resolution included (its default): what the scan mirrors.
    rules = ProducerStateTable(64, LIFETIME, resolve_gaps=True)
    last = encode_pf(pid, gen, 0)
    rules.offer_header(last, 0)
    for op in prefix:
        if op == "data":
            last, nxt = encode_pf(pid, gen, nxt), nxt + 1
        elif op == "fence":
            gen += 1
            rules.offer_header(encode_pf(pid, gen, nxt, FLAG_FENCE), 0)
            continue
        rules.offer_header(last, 0)
    entry = rules.get(pid)
    assert entry is not None
    high = entry[1]
    next_seq = {tp: high + 1} if known in ("next_seq", "both") else {}
    ahead = {tp: high + 1} if known in ("ahead", "both") else {}
    cp = ProducerCheckpoint(pid, entry[0], 10**9, next_seq, ahead=ahead)
    state = scan_state(cp, pid + 1)
    for op in suffix:
        if op == "fence":
            gen += 1
            header = encode_pf(pid, gen, nxt, FLAG_FENCE)
        elif op == "dup":
            header = last
        else:
            last, nxt = encode_pf(pid, gen, nxt), nxt + 1
            if op == "drop":
                continue  # lost on the way: a gap the rules hold records behind
            header = last
        rules.offer_header(header, 0)
        state.note(tp, [(PF_HEADER_KEY, header)])
    entry = rules.get(pid)
    assert entry is not None
    assert state.highs[pid].get(tp, -1) == entry[1]


def land_pending_without_acks(rig: SharedRig) -> None:
    """The stuck records reach the broker, but their acknowledgements are lost with the process."""
    assert rig.kafka is not None
    for msg, _callback in rig.kafka.pending:
        tp = (msg.topic(), msg.partition())
        msg._offset = rig.offsets.get(tp, 0)
        rig.offsets[tp] = msg._offset + 1
        rig.log.append(msg)
    rig.kafka.pending = []


def drain_failed_then_crash(rig: SharedRig) -> ProducerCheckpoint:
    """A's checkpoint is saved before its first record; A writes z0..z9, the last five of them
    unacknowledged when its drain before the rollover fails (exit 75 in the CLI); they land in
    Kafka anyway. A's lease then ends before its restart."""
    a = rig.producer()
    fresh = a.checkpoint()
    assert not fresh.topics and not fresh.next_seq  # names no topic: what went wrong before
    send(a, 0, 5)
    assert rig.kafka is not None
    rig.kafka.stuck = True
    for i in range(5, 10):
        a.produce("t", z(i), partition=i % 3, event_id=f"z{i}")
    rig.now += ROLL_AT
    with pytest.raises(DrainFailed):
        a.produce("t", z(10), partition=1)
    land_pending_without_acks(rig)
    rig.now = fresh.expire_ms + 1
    return fresh


def test_restart_after_a_failed_drain_from_a_checkpoint_without_topics_skips_what_landed(
    rig: SharedRig,
) -> None:
    fresh = drain_failed_then_crash(rig)
    b = rig.resume(fresh, topics=["t"])  # what `pidfence produce`/`copy` pass: their topics
    assert b.resumed_how == "rolled" and b.sequencer.pid != fresh.pid
    send(b, 0, 12)  # the source replays from the checkpoint: z0..z9 again, then z10, z11
    exactly_once(rig, 12)


def test_restart_without_the_callers_topics_would_append_twice(rig: SharedRig) -> None:
    # The mutation that shows the test above has teeth: the checkpoint alone names no topic, so
    # nothing is scanned and the successor pid re-sends z0..z9 under fresh seqs.
    fresh = drain_failed_then_crash(rig)
    b = rig.resume(fresh)
    send(b, 0, 12)
    twice = {value for value, n in rig.appended().items() if n > 1}
    assert twice == {z(i) for i in range(10)}


def test_older_checkpoint_after_the_successor_ended_skips_what_both_pids_got_in(
    rig: SharedRig,
) -> None:
    # Found by the simulation with lease outages (seed 2): the owner rolled at z6 and its
    # successor then died; an older checkpoint (z3) resumed after the successor's lease ended
    # follows the lineage to the successor, finds it ended and rolls it in turn. The scan must
    # read the successor's records too: z6..z9 are in Kafka under it, and the new pid would
    # otherwise send them again under fresh seqs (twice in the output).
    _, old = rolled_after_an_old_checkpoint(rig, 10)
    rig.now += LIFETIME  # the successor (pid 101) is not resumed before its lease ends
    b = rig.resume(old)
    assert b.resumed_how == "rolled" and b.sequencer.pid == 102
    assert sum(b.sequencer.skip.values()) == 7  # z3..z5 under pid 100, z6..z9 under 101
    send(b, 3, 12)
    exactly_once(rig, 12)
