"""Copier groups (``pidfence copy --group``) on a real Kafka and lease server.

The output topic is replayed through the broker rules (``pidfence.broker_plugin``) in offset order,
as the sink does (the chaos tier runs the sink itself): what they append must be the input's
values, each once, in order per partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pidfence.demo.copier_group import CopierGroup, GroupFaults, run_with_faults
from pidfence.demo.procs import ProducerRole, ProducerSpec
from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from pidfence.producer import IdempotentProducer, ProducerConfig, ProducerFenced
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.copy_task import CopyTask, task_opener
from pidfence.producer.driver import SessionDriver
from pidfence.producer.lease import LeaseKeeper
from pidfence.spark_sink import read_log, read_rejects, run_sink
from pidfence.testing import FaultKind, FaultPlan, install_mutation, step
from pidfence.wire import Verdict
from tests.fixtures.produced import read_topic, replay, run_cli
from tests.unit.kafka_kit import Message

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 4
#: Members' settings: a short session (a dead member's partitions move after 6 s), idle exit.
MEMBER_ARGS = ("--session-timeout", "6", "--idle-exit", "6", "--message-timeout", "5s")


def assert_exact(bootstrap: str, source: str, target: str) -> Counter[Verdict]:
    """Every input value appended exactly once, in input order per partition; the verdicts."""
    expected: dict[int, list[bytes | None]] = {}
    for record in read_topic(bootstrap, source):
        expected.setdefault(record.partition, []).append(record.value)
    verdicts = replay(read_topic(bootstrap, target))
    appended: dict[int, list[bytes | None]] = {}
    for record, verdict in verdicts:
        if verdict is Verdict.APPENDED:
            appended.setdefault(record.partition, []).append(record.value)
    for partition, values in expected.items():
        got = appended.get(partition, [])
        if got != values:
            counts = Counter(got)
            missing = [v for v in values if v not in counts]
            twice = [v for v, n in counts.items() if n > 1]
            raise AssertionError(
                f"partition {partition}: {len(got)} appended, {len(values)} expected; "
                f"missing {len(missing)} {missing[:5]}; twice {len(twice)} {twice[:5]}"
            )
    return Counter(v for _, v in verdicts)


def test_three_members_share_the_partitions_through_a_kill_and_a_join(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """The issue's case: three members of one group copy a 4-partition topic while a producer
    writes; one is SIGKILLed and restarted mid-way, one joins mid-way. Every input event is
    appended once, every member exits 0, and each copied some of it."""
    source, target = new_topic(partitions=PARTITIONS), new_topic(partitions=PARTITIONS)
    count = 4000
    spec = ProducerSpec(
        "up",
        kafka.bootstrap,
        lease_server.address,
        source,
        count,
        tmp_path / "up.json",
        rate=200,
        extra=("--message-timeout", "5s"),
    )
    upstream = ProducerRole(spec, tmp_path / "ledgers", tmp_path / "logs")
    group = CopierGroup(
        kafka.bootstrap, lease_server.address, source, target, f"g-{source}", tmp_path, MEMBER_ARGS
    )
    plan = FaultPlan(
        (step(FaultKind.KILL, "a", at_acked=0.2), step(FaultKind.JOIN, "c", at_acked=0.4))
    )
    faults = GroupFaults(group, plan, total=count)
    codes = run_with_faults(group, upstream, faults, {"a": (), "b": ()}, drive_s=180, wait_s=120)
    assert faults.happened, faults.events
    ended = {w.name: w.fate or codes[w.name] for w in group.workers}
    assert ended == {"a": "killed", "a.r1": 0, "b": 0, "c": 0}, [w.tail() for w in group.workers]
    copied = {name: sum(w.acked() for w in ws) for name, ws in group.members.items()}
    assert all(copied[name] > 0 for name in "abc"), copied
    verdicts = assert_exact(kafka.bootstrap, source, target)
    assert set(verdicts) <= {Verdict.APPENDED, Verdict.DUPLICATE, Verdict.FENCE, Verdict.FENCED}


class Commits:
    """The group's committed (offset, checkpoint) of one partition, as a dict."""

    def __init__(self) -> None:
        self.last: tuple[int, ProducerCheckpoint] | None = None

    def store(self, partition: int, offset: int, checkpoint: ProducerCheckpoint) -> None:
        del partition
        self.last = (offset, checkpoint)


@pytest.fixture
def copy_kit(
    kafka: Any, lease_server: LeaseServerThread
) -> Iterator[Callable[[Commits, str], CopyTask]]:
    """``open(commits, target)``: a task of partition 0 opened from ``commits`` (closed after)."""
    tasks: list[CopyTask] = []
    with LeaseClient(lease_server.address) as client:
        opener = task_opener(ProducerConfig(kafka.bootstrap), client)

        def open_task(commits: Commits, target: str) -> CopyTask:
            task = CopyTask.open(0, target, commits.last, 0, opener, commits.store)
            tasks.append(task)
            return task

        yield open_task
        for task in tasks:
            task.close()


def test_a_zombie_takeover_that_fences_the_owner_is_caught_by_the_owners_bump(
    kafka: Any,
    new_topic: Callable[..., str],
    copy_kit: Callable[[Commits, str], CopyTask],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Race: B owns the partition (resumed from the group's commit); a zombie Z that read the
    same commit before it was dropped from the group resumes it late, which bumps past B and
    FENCEs B's records after that point. B's next checkpoint bump is refused, so B commits
    nothing and copies again from the last commit; the output stays exact. A build that commits
    without the bump (mutation ``copy-commit-without-bump``: the bump only takes a checkpoint)
    is caught by that checkpoint's own question to the lease server; without that question too,
    it loses the records Z fenced."""
    mutated = _race(kafka, new_topic, copy_kit)
    assert not mutated, "the owner's bump did not see the zombie's takeover"
    monkeypatch.setattr(IdempotentProducer, "bump", IdempotentProducer.bump)
    install_mutation("copy-commit-without-bump")
    assert not _race(kafka, new_topic, copy_kit), "the checkpoint did not see the takeover"
    monkeypatch.setattr(LeaseKeeper, "confirm", lambda self, current: None)
    with pytest.raises(AssertionError, match=r"missing [1-9]"):
        _race(kafka, new_topic, copy_kit)


def _race(
    kafka: Any, new_topic: Callable[..., str], open_task: Callable[[Commits, str], CopyTask]
) -> bool:
    """The race of the test above; True when the owner's checkpoint went through."""
    source, target = new_topic(), new_topic()
    records = _fill(kafka.bootstrap, source, 300)
    commits = Commits()
    _first_owner(open_task, commits, target, records[:100]).close()
    read_by_zombie = commits.last
    owner = open_task(commits, target)  # the group's new owner of the partition
    for msg in records[100:150]:
        owner.copy(msg)
    owner.producer.flush(30)
    # The zombie read the same commit before the group dropped it; its resume FENCEs now.
    zombie = open_task(_at(read_by_zombie), target)
    for msg in records[150:200]:
        owner.copy(msg)  # after the zombie's FENCE: FENCED
    for msg in records[150:170]:
        zombie.copy(msg)  # it dies before its commit, which the group would refuse anyway
    zombie.close()
    try:
        owner.checkpoint()
        went_through = True
    except ProducerFenced:
        went_through = False
        owner.close()
        owner = open_task(commits, target)  # dropped, then opened again from the commit
    for msg in records[owner.offset :]:
        owner.copy(msg)
    owner.checkpoint()
    assert_exact(kafka.bootstrap, source, target)
    return went_through


def test_a_takeover_that_recopies_across_two_checkpoints_loses_nothing(
    kafka: Any,
    new_topic: Callable[..., str],
    copy_kit: Callable[[Commits, str], CopyTask],
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner copied far past its last commit, then died (SIGKILL: no commit). The next owner
    re-copies those records across two of its checkpoints, and the sink drops every one as a
    ``DUPLICATE``, which moves no generation. Each checkpoint bumps, so its first new record is
    two generations ahead of what the sink holds unless each bump FENCEs its generation: without
    that (issue 44's chaos failure) it is ``INVALID_GENERATION``, and so is every record after
    it, which the owner goes on committing: those events are lost. The build without that FENCE
    (mutation ``bump-without-fence``) loses them here."""

    def recopy(work: Path) -> tuple[list[str], Counter[str]]:
        """The takeover above, then the sink: each source record's fate in the log
        (``sent``, or ``lost``/``twice``) and the rejects' verdicts."""
        source, target = new_topic(), new_topic()
        records = _fill(kafka.bootstrap, source, 200)
        commits = Commits()
        first = _first_owner(copy_kit, commits, target, records[:50])
        for msg in records[50:170]:
            first.copy(msg)
        first.producer.flush(30)  # in Kafka, then SIGKILLed before its next checkpoint
        owner = copy_kit(commits, target)  # the group's next owner: resume, FENCE, commit
        for msg in records[owner.offset :]:
            owner.copy(msg)
            if owner.pending == 50:
                owner.checkpoint()
        owner.checkpoint()
        out = work / "out"
        run_sink(spark, kafka.bootstrap, target, str(out), str(work / "ckpt"))
        values = Counter(read_log(str(out)).column("value").to_pylist())
        verdicts = Counter(str(v) for v in read_rejects(str(out)).column("verdict").to_pylist())
        fate = {1: "sent", 0: "lost"}
        return [fate.get(values[r.value()], "twice") for r in records], verdicts

    log, verdicts = recopy(tmp_path / "exact")
    assert log == ["sent"] * 200, verdicts
    assert set(verdicts) == {"DUPLICATE", "FENCE"}, verdicts
    monkeypatch.setattr(SessionDriver, "announce", SessionDriver.announce)
    install_mutation("bump-without-fence")
    log, verdicts = recopy(tmp_path / "mutated")
    assert "INVALID_GENERATION" in verdicts
    assert log.count("sent") < 200


def _first_owner(
    open_task: Callable[[Commits, str], CopyTask],
    commits: Commits,
    target: str,
    records: list[Message],
) -> CopyTask:
    """The partition's first owner: it copies ``records`` and commits them."""
    task = open_task(commits, target)
    for msg in records:
        task.copy(msg)
    task.checkpoint()
    return task


def _at(committed: tuple[int, ProducerCheckpoint] | None) -> Commits:
    commits = Commits()
    commits.last = committed
    return commits


def _fill(bootstrap: str, topic: str, count: int) -> list[Message]:
    """``count`` plain records sent to partition 0 of ``topic``, as a copier consumes them."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, f"r{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    return [
        Message(topic, r.partition, r.offset, r.key, r.value) for r in read_topic(bootstrap, topic)
    ]


def test_a_member_is_told_what_it_needs(
    kafka: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Neither --state nor --group is a usage error; a single copier's state file given to a
    group is refused (the group would copy everything again); a member whose lease server is
    gone ends retriable, naming it, once it has been idle."""
    source, target = new_topic(partitions=2), new_topic(partitions=2)
    base = ("copy", "--bootstrap", kafka.bootstrap, "--from-topic", source, "--to-topic", target)
    gone = ("--lease-server", "127.0.0.1:1")
    neither = run_cli(*base, *gone)
    assert neither.returncode == 2 and "--state FILE" in neither.stderr
    state = tmp_path / "copy.json"
    state.write_text("{}")
    both = run_cli(*base, *gone, "--state", str(state), "--group", "g")
    assert both.returncode == 2 and "single copier's progress" in both.stderr
    member = run_cli(*base, *gone, "--group", f"g-{source}", "--idle-exit", "1")
    assert member.returncode == 75, member.stderr
    assert "PartitionsNotCopied" in member.stderr and "127.0.0.1:1" in member.stderr
