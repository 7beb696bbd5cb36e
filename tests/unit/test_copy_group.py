"""A copier group member's decisions, over a scripted consumer and fake task producers: when it
commits, what a commit holds, and what it does when a bump or a commit is refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from pidfence.producer import BrokerUnavailable, ProducerCheckpoint, ProducerFenced
from pidfence.producer.copier import CopySpec
from pidfence.producer.copy_checkpoint import MetadataCodec
from pidfence.producer.copy_group import CopyGroup, PartitionsNotCopied
from pidfence.producer.copy_task import CopyTask
from pidfence.testing import ManualClock
from tests.unit.kafka_kit import Message

SOURCE, TARGET = "in", "out"
CODEC = MetadataCodec("g", SOURCE, TARGET)


@dataclass
class FakeProducer:
    """A task producer: seqs count records; ``refuse`` makes the next bump fail."""

    partition: int
    generation: int
    seq: int = 0
    refuse: bool = False
    closed: bool = False
    rollover_due: bool = False
    partition_pid: int = 0
    log: list[str] = field(default_factory=list)

    def produce(self, topic: str, value: Any, **_: Any) -> int:
        self.log.append(f"produce {value.decode()}")
        self.seq += 1
        return self.partition

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def checkpoint(self, *, confirm: bool = True) -> ProducerCheckpoint:
        tp = (TARGET, self.partition)
        pid = self.partition_pid or self.partition + 1
        return ProducerCheckpoint(pid, self.generation, 2**45, {tp: self.seq})

    def bump(self) -> ProducerCheckpoint:
        self.log.append("bump")
        if self.refuse:
            raise ProducerFenced("another owner bumped it")
        self.generation += 1
        return self.checkpoint()

    def roll(self, save: Callable[[ProducerCheckpoint], None]) -> ProducerCheckpoint:
        self.log.append("roll")
        self.rollover_due = False
        self.partition_pid = 99  # the successor, its seqs from 0
        self.generation, self.seq = 500, 0
        successor = self.checkpoint()
        save(successor)
        return successor

    def close(self, timeout: float = 30.0) -> None:
        self.closed = True


#: Polls after the script ran out before a member that never ends fails the test (a member
#: waiting for a group commit that never comes spun for minutes of real time).
IDLE_POLLS = 10_000


class ScriptedConsumer:
    """Plays ``script`` (callbacks to run, or records to return) one step per ``consume``."""

    def __init__(self, clock: ManualClock[float], script: list[tuple[str, list[Any]]]) -> None:
        self.clock, self.script = clock, script
        self.idle_polls = 0
        self.commits: dict[int, tuple[int, str]] = {}
        #: Partition -> next offset to return (the consumer's position).
        self.fetching: dict[int, int] = {}
        self.log: list[str] = []
        #: The input's end offsets: past the last record the script holds.
        self.ends: dict[int, int] = {}
        for what, items in script:
            for msg in items if what == "records" else ():
                self.ends[msg.partition_] = max(self.ends.get(msg.partition_, 0), msg.offset_ + 1)

    def list_topics(self, topic: str, timeout: float) -> Any:
        info = SimpleNamespace(error=None, partitions=dict.fromkeys(range(2)))
        return SimpleNamespace(topics={topic: info})

    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self.callbacks = callbacks

    def consume(self, n: int, timeout: float) -> list[Any]:
        self.clock.now += timeout
        if not self.script:
            self.idle_polls += 1
            if self.idle_polls > IDLE_POLLS:
                raise AssertionError(f"the member never ended; its log: {self.log}")
            return []
        what, items = self.script.pop(0)
        if what == "call":
            items[0]()
            return []
        if what == "records":
            out = [m for m in items if m.partition_ in self.fetching]
            for msg in out:
                self.fetching[msg.partition_] = msg.offset_ + 1
            return out
        parts = [confluent_kafka.TopicPartition(SOURCE, p) for p in items]
        self.callbacks[f"on_{what}"](self, parts)
        return []

    def committed(self, tps: list[Any], timeout: float) -> list[Any]:
        found = [(tp.partition, *self.commits.get(tp.partition, (-1001, ""))) for tp in tps]
        return [confluent_kafka.TopicPartition(SOURCE, p, o, m) for p, o, m in found]

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, self.ends.get(tp.partition, 0)

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        """Starts (timestamp -2) and ends (-1) of the input's partitions."""
        return [
            confluent_kafka.TopicPartition(
                SOURCE, tp.partition, 0 if tp.offset == -2 else self.ends.get(tp.partition, 0)
            )
            for tp in tps
        ]

    def position(self, tps: list[Any]) -> list[Any]:
        return [
            confluent_kafka.TopicPartition(SOURCE, tp.partition, self.fetching[tp.partition])
            for tp in tps
        ]

    def incremental_assign(self, tps: list[Any]) -> None:
        self.fetching.update({tp.partition: tp.offset for tp in tps})
        self.log.extend(f"fetch {tp.partition} from {tp.offset}" for tp in tps)

    def incremental_unassign(self, tps: list[Any]) -> None:
        for tp in tps:
            self.fetching.pop(tp.partition)

    def commit(self, offsets: list[Any], asynchronous: bool) -> list[Any]:
        for tp in offsets:
            self.commits[tp.partition] = (tp.offset, tp.metadata)
            self.log.append(f"commit {tp.partition} at {tp.offset}")
        return offsets

    def close(self) -> None:
        self.log.append("close")
        parts = [confluent_kafka.TopicPartition(SOURCE, p) for p in self.fetching]
        self.callbacks["on_revoke"](self, parts)


class Member:
    """A :class:`CopyGroup` over a :class:`ScriptedConsumer`; ``producers`` in opening order."""

    def __init__(self, script: list[tuple[str, list[Any]]], **spec: Any) -> None:
        self.clock = ManualClock(100.0)
        self.consumer = ScriptedConsumer(self.clock, script)
        self.producers: list[FakeProducer] = []
        self.opened_from: list[ProducerCheckpoint | None] = []
        settings = {"idle_exit_s": 5.0, "checkpoint_every": 3, **spec}
        self.group = CopyGroup(
            CopySpec("kafka:9092", SOURCE, TARGET, group="g", **settings),
            self._open,
            CODEC,
            consumer_factory=lambda conf: self.consumer,
            clock=self.clock,
        )

    def _open(self, checkpoint: ProducerCheckpoint | None, output: Any) -> FakeProducer:
        self.opened_from.append(checkpoint)
        generation = 10 if checkpoint is None else checkpoint.generation + 1
        seq = 0 if checkpoint is None else checkpoint.next_seq.get(output, 0)
        producer = FakeProducer(output[1], generation, seq, log=self.consumer.log)
        self.producers.append(producer)
        return producer

    def committed(self, partition: int) -> tuple[int, ProducerCheckpoint]:
        offset, metadata = self.consumer.commits[partition]
        return offset, CODEC.decode(partition, metadata)


def records(partition: int, offsets: range) -> tuple[str, list[Any]]:
    return (
        "records",
        [Message(SOURCE, partition, o, value_=f"{partition}:{o}".encode()) for o in offsets],
    )


def test_a_task_commits_before_its_first_record_and_hands_over_with_a_proven_commit() -> None:
    member = Member([("assign", [0]), records(0, range(5)), ("revoke", [0])])
    result = member.group.run()
    log = member.consumer.log
    assert log[:2] == ["commit 0 at 0", "fetch 0 from 0"]  # a fresh pid, committed first
    # Every commit after a record follows a bump; the commit holds the generation the records
    # went out under (the output's), not the bumped one.
    assert log[2:] == [
        *(f"produce 0:{o}" for o in range(3)),
        "bump",
        "commit 0 at 3",
        *(f"produce 0:{o}" for o in range(3, 5)),
        "bump",
        "commit 0 at 5",
        "close",
    ]
    assert member.committed(0)[1].generation == 11 and member.committed(0)[1].next_seq == {
        (TARGET, 0): 5
    }
    assert member.producers[0].closed and result.per_partition == {0: 5}


def test_a_takeover_resumes_the_committed_checkpoint_at_its_offset() -> None:
    member = Member([("assign", [1]), records(1, range(40, 42))])
    checkpoint = ProducerCheckpoint(7, 55, 2**45, {(TARGET, 1): 40})
    member.consumer.commits[1] = (40, CODEC.encode(1, checkpoint))
    member.group.run()
    assert member.opened_from == [checkpoint]
    assert member.consumer.log[:2] == ["commit 1 at 40", "fetch 1 from 40"]
    assert member.committed(1) == (42, member.committed(1)[1])
    assert member.committed(1)[1].next_seq == {(TARGET, 1): 42}


def test_a_lost_partition_is_closed_without_a_commit_and_continued_from_the_commit() -> None:
    lost_and_back = [("lost", [0]), ("assign", [0])]
    member = Member([("assign", [0]), records(0, range(2)), *lost_and_back, records(0, range(2))])
    member.group.run()
    first, again = member.producers
    assert first.closed and "bump" not in first.log[: first.log.index("produce 0:1") + 2]
    assert member.opened_from[1] == FakeProducer(0, 10).checkpoint()  # the opening commit
    assert member.consumer.log.count("fetch 0 from 0") == 2
    assert member.consumer.commits[0][0] == 2 and again.log.count("produce 0:0") == 2


def test_a_refused_bump_commits_nothing_and_the_task_is_opened_again_from_the_commit() -> None:
    member = Member(
        [("assign", [0]), records(0, range(3)), records(0, range(3, 6))]
        + [("records", [])] * 20
        + [records(0, range(6))]
    )
    member.group._open_producer = _refusing(member._open)
    member.group.run()
    first, again = member.producers
    assert first.closed and not again.refuse
    # After the refused bump nothing is committed (the records may have been FENCED); the task
    # opens again from the group's commit, as it stood, and copies from its offset.
    assert member.consumer.log[:8] == [
        "commit 0 at 0",
        "fetch 0 from 0",
        *(f"produce 0:{o}" for o in range(3)),
        "bump",
        "commit 0 at 0",
        "fetch 0 from 0",
    ]
    assert member.opened_from[1] == FakeProducer(0, 10).checkpoint()
    assert member.consumer.commits[0][0] == 6


def _refusing(opener: Callable[..., FakeProducer]) -> Callable[..., FakeProducer]:
    """The first producer opened refuses its bump; later ones do not."""
    opened: list[FakeProducer] = []

    def open_task(checkpoint: ProducerCheckpoint | None, output: Any) -> FakeProducer:
        producer = opener(checkpoint, output)
        producer.refuse = not opened
        opened.append(producer)
        return producer

    return open_task


@pytest.mark.parametrize("refused_at", [3, 6])
def test_a_refused_commit_keeps_the_task_and_is_made_again_without_a_new_bump(
    refused_at: int,
) -> None:
    """A rebalance under way refuses the commit at ``refused_at``; the task goes on, and the
    commit is made again (at the next checkpoint, or at the next idle poll for the last one)
    with no extra bump: the one before it proved those records unfenced."""
    member = Member([("assign", [0]), records(0, range(3)), records(0, range(3, 6))])
    commit = member.consumer.commit
    refused: list[int] = []

    def refuse_once(offsets: list[Any], asynchronous: bool) -> list[Any]:
        if offsets[0].offset == refused_at and not refused:
            refused.append(refused_at)
            raise confluent_kafka.KafkaException(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError.ILLEGAL_GENERATION)
            )
        return commit(offsets, asynchronous)

    member.consumer.commit = refuse_once  # type: ignore[method-assign]
    member.group.run()
    assert refused and len(member.producers) == 1  # not dropped
    assert member.producers[0].log.count("bump") == 2
    assert member.consumer.commits[0][0] == 6
    assert member.consumer.log.index("commit 0 at 6") < member.consumer.log.index("close")


def test_a_timed_out_read_of_the_groups_commit_is_tried_again_and_the_task_goes_on() -> None:
    """A busy coordinator times the read out (a rebalance under load): the partition is opened
    again ``RETRY_S`` later from the commit, instead of ending the member."""
    member = Member([("assign", [0]), *([("records", [])] * 20), records(0, range(3))])
    committed = member.consumer.committed
    timed_out: list[int] = []

    def time_out_once(tps: list[Any], timeout: float) -> list[Any]:
        if not timed_out:
            timed_out.append(tps[0].partition)
            raise confluent_kafka.KafkaException(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError._TIMED_OUT)
            )
        return committed(tps, timeout)

    member.consumer.committed = time_out_once  # type: ignore[method-assign]
    member.group.run()
    assert timed_out == [0] and member.consumer.log[:2] == ["commit 0 at 0", "fetch 0 from 0"]
    assert member.consumer.commits[0][0] == 3


def test_a_read_of_the_groups_commit_refused_for_good_ends_the_member() -> None:
    member = Member([("assign", [0])])

    def refuse(tps: list[Any], timeout: float) -> list[Any]:
        raise confluent_kafka.KafkaException(
            confluent_kafka.KafkaError(confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED)
        )

    member.consumer.committed = refuse  # type: ignore[method-assign]
    with pytest.raises(BrokerUnavailable, match="reading the group's commit"):
        member.group.run()


def test_a_member_waits_for_its_first_assignment_and_reports_partitions_it_cannot_open() -> None:
    member = Member([("records", [])] * 30 + [("assign", [0])], idle_exit_s=1.0)

    def down(checkpoint: ProducerCheckpoint | None, output: Any) -> FakeProducer:
        from pidfence.producer import LeaseServerDown

        raise LeaseServerDown("no lease server answered")

    member.group._open_producer = down
    with pytest.raises(PartitionsNotCopied, match=r"partitions \[0\].*no lease server"):
        member.group.run()
    # 30 empty polls (6 s) before the first assignment did not end it.
    assert member.clock.now > 100.0 + 30 * 0.2


def test_a_quiet_member_waits_until_the_group_has_committed_every_input_partition() -> None:
    """A member with nothing assigned (a rebalance under way, or more members than work) does
    not end while another member's partition is still uncommitted."""
    member = Member([("assign", []), *[("records", [])] * 40])
    member.consumer.ends = {1: 10}  # partition 1 holds 10 records: somebody else's work

    def other_member_commits() -> None:
        member.consumer.commits[1] = (10, "")
        member.consumer.log.append("the other member committed")

    member.consumer.script.append(("call", [other_member_commits]))
    member.group.run()
    # It went quiet after 5 s (idle_exit_s) but ended only after the other member's commit.
    assert member.consumer.log[-2:] == ["the other member committed", "close"]
    assert member.clock.now >= 100.0 + 41 * 0.2


def test_a_rollover_commits_the_successor_with_the_offset_of_the_record_it_sends_first() -> None:
    member = Member([("assign", [0]), records(0, range(2))])

    def rollover_due() -> None:
        member.producers[0].rollover_due = True

    member.consumer.script += [("call", [rollover_due]), records(0, range(2, 4))]
    member.group.run()
    log = member.consumer.log
    at = log.index("roll")
    assert log[at - 1 : at + 3] == ["produce 0:1", "roll", "commit 0 at 2", "produce 0:2"]
    assert member.committed(0)[1].pid == 99  # the successor, committed again at the end


def test_a_member_paused_in_its_idle_checkpoint_and_fenced_there_waits_for_the_group() -> None:
    """The chaos flake of session 11: a member is paused (SIGSTOP) past its session timeout and
    ``idle_exit_s`` during its idle checkpoint's bump, which the partition's new owner has
    fenced meanwhile, so it drops the task on waking. A task dropped just now is no partition
    the member failed to open for ``idle_exit_s``: it waits for the group to take the
    partition away (lost), and ends once the new owner has committed, instead of exiting 75."""
    member = Member([("assign", [0]), records(0, range(2))])

    class PausedInBump(FakeProducer):
        def bump(self) -> ProducerCheckpoint:
            member.clock.now += 9.0
            self.refuse = True  # the new owner bumped the pid meanwhile
            return super().bump()

    opener = member.group._open_producer

    def open_task(checkpoint: ProducerCheckpoint | None, output: Any) -> FakeProducer:
        plain = opener(checkpoint, output)
        paused = PausedInBump(plain.partition, plain.generation, plain.seq, log=plain.log)
        member.producers[-1] = paused
        return paused

    def the_new_owner_commits() -> None:
        member.consumer.commits[0] = (2, "")

    member.group._open_producer = open_task
    member.consumer.script += [
        *[("records", [])] * 6,  # quiet for IDLE_COMMIT_S: the tail checkpoint bumps
        ("lost", [0]),
        ("call", [the_new_owner_commits]),
        *[("records", [])] * 40,
    ]
    result = member.group.run()
    # The refused bump was the task's last act; nothing was committed after it.
    assert member.consumer.log[-2:] == ["bump", "close"] and member.producers[0].closed
    assert len(member.producers) == 1  # never opened again: the group took the partition away
    assert result.per_partition == {0: 2}
    assert member.consumer.commits[0] == (2, "")


def test_a_pause_is_not_idleness_for_a_partition_that_was_failing_before_it() -> None:
    """Partition 0 could not be opened (no lease server) just before the member was paused past
    ``idle_exit_s`` inside ``consume()``; on waking, the group's lost callback comes a poll
    later. The pause is no idle time in which the member tried again: it waits, learns the
    partition is gone, and ends once the group has committed, instead of exiting 75."""
    member = Member([("assign", [0])], idle_exit_s=5.0)
    opener = member.group._open_producer

    def down_once(checkpoint: ProducerCheckpoint | None, output: Any) -> FakeProducer:
        from pidfence.producer import LeaseServerDown

        if not member.producers:
            member.producers.append(FakeProducer(0, 0, closed=True))  # the failed attempt
            raise LeaseServerDown("no lease server answered")
        return opener(checkpoint, output)

    def pause() -> None:
        member.clock.now += 9.0

    def the_new_owner_commits() -> None:
        member.consumer.commits[0] = (0, "")

    member.group._open_producer = down_once
    member.consumer.script += [
        ("call", [pause]),
        ("lost", [0]),
        ("call", [the_new_owner_commits]),
        *[("records", [])] * 40,
    ]
    member.group.run()  # ends once the group has committed, not with PartitionsNotCopied
    assert all(p.closed for p in member.producers)


def test_a_handover_whose_last_commit_fails_still_gives_the_partition_up() -> None:
    """The revoked task's last checkpoint cannot be made (its FENCE was not acknowledged): the
    task is closed and the partition unassigned all the same, so the group's rebalance
    completes; the next owner copies again from the commit before."""
    member = Member([("assign", [0]), records(0, range(2))])

    def broker_gone() -> None:
        def bump() -> ProducerCheckpoint:
            raise BrokerUnavailable("the FENCE was not acknowledged in 60 s")

        member.producers[0].bump = bump  # type: ignore[method-assign]

    def the_next_owner_commits() -> None:
        assert member.consumer.commits[0][0] == 0  # the opening commit stood
        member.consumer.commits[0] = (2, "")

    member.consumer.script += [
        ("call", [broker_gone]),
        ("revoke", [0]),
        ("call", [the_next_owner_commits]),
    ]
    member.group.run()
    assert member.producers[0].closed and 0 not in member.consumer.fetching


def test_a_member_leaving_during_a_rebalance_opens_nothing_it_is_about_to_give_up() -> None:
    """A rebalance was under way when the member stopped: closing the consumer delivers the
    pending assignment first. Opening those tasks (a bump, FENCE and scan each) would be work
    for nothing, and their handover commits would be refused by a group the member has left:
    they stay unopened, and their last owners' commits stand."""
    member = Member([("assign", [0]), records(0, range(3))], max_records=3)
    close = member.consumer.close

    def close_during_a_rebalance() -> None:
        member.consumer.callbacks["on_assign"](
            member.consumer, [confluent_kafka.TopicPartition(SOURCE, 1)]
        )
        close()

    member.consumer.close = close_during_a_rebalance  # type: ignore[method-assign]
    member.group.run()
    assert [p.partition for p in member.producers] == [0]
    assert 1 not in member.consumer.commits
    assert member.consumer.commits[0][0] == 3  # partition 0 handed over with its commit


def test_a_task_commits_each_checkpoint_once_and_moves_past_markers_when_caught_up() -> None:
    commits: list[int] = []
    task = CopyTask.open(
        0,
        TARGET,
        None,
        5,
        lambda checkpoint, output: FakeProducer(0, 10),
        lambda partition, offset, checkpoint: commits.append(offset),
    )
    assert not task.unstored
    task.checkpoint()  # nothing copied since the commit: nothing to commit
    task.caught_up(8)  # offsets 5..7 hold transaction markers
    task.checkpoint()
    assert commits == [5, 8]
