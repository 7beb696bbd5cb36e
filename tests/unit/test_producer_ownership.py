"""A checkpoint confirms that this instance still owns its pid (docs/producer.md, "What a user
stores, and when"): a zombie replaced by a resume of its checkpoint must not store its own.

The world: the real lease service (:class:`~pidfence.sim.lease.SimLeaseServer`: lineage,
owners, ``describe``) on a fake clock, and one Kafka log that every instance's fake client
appends to, replayed through the broker rules as the sink applies them.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator.errors import LeaseServerUnreachable, UnknownOp
from pidfence.producer import (
    IdempotentProducer,
    LeaseServerDown,
    LeaseState,
    ProducerCheckpoint,
    ProducerConfig,
    ProducerError,
    ProducerFenced,
)
from pidfence.producer.loadgen import LoadGenerator, LoadSpec
from pidfence.producer.recovery import ScanState
from pidfence.producer.statefile import load_state
from pidfence.sim.lease import SimLeaseServer
from pidfence.wire import PidStatus
from tests.unit.producer_kit import FakeKafka, appended_by_rules

LIFETIME = 24 * 3600 * 1000


class World:
    """The real lease service and one shared Kafka log; producers and resumes on them."""

    def __init__(self) -> None:
        self.lease = SimLeaseServer(random.Random(7), LIFETIME)
        self.lease.tick(1_000_000)
        self.log: list[Any] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.config = ProducerConfig("127.0.0.1:9", message_timeout_ms=1000)

    def clock(self) -> int:
        return self.lease.now

    def factory(self, conf: dict[str, Any]) -> FakeKafka:
        kafka = FakeKafka(conf, {"t": 3})
        kafka.log, kafka.offsets = self.log, self.offsets
        return kafka

    def producer(self, client: Any = None) -> IdempotentProducer:
        return IdempotentProducer(
            self.config, client or self.lease, clock=self.clock, producer_factory=self.factory
        )

    def resume(self, cp: ProducerCheckpoint, client: Any = None) -> IdempotentProducer:
        return IdempotentProducer.resume(
            cp,
            client or self.lease,
            self.config,
            clock=self.clock,
            producer_factory=self.factory,
            scanner=self.scan,
        )

    def scan(self, state: ScanState, partitions: Any, since_ms: int, until: dict[Any, int]) -> None:
        wanted = set(partitions)
        for msg in self.log:
            tp = (msg.topic(), msg.partition())
            if tp in wanted and msg.offset() < until.get(tp, 1 << 62):
                state.note(tp, msg.headers())

    def appended(self) -> list[bytes]:
        """The values the broker rules append, replaying the log in offset order."""
        return appended_by_rules(self.log)


EVENTS = [b"e%d" % i for i in range(12)]


def send(producer: IdempotentProducer, start: int, stop: int) -> None:
    for i in range(start, stop):
        producer.produce("t", EVENTS[i], partition=0)
    assert producer.flush() == 0


def test_a_replaced_instance_cannot_store_its_checkpoint_over_its_replacements() -> None:
    """The review's case: A stores (3, its checkpoint) and pauses; B resumes from it, copies
    e3, stores (4, ...) and dies; A wakes, sends e3..e5 (the sink FENCEs them) and stores. Were
    A's store accepted, C would resume from 6 and e4, e5 would never reach the output."""
    world = World()
    state: dict[str, Any] = {}
    a = world.producer()
    send(a, 0, 3)
    state.update(pos=3, cp=a.checkpoint())
    b = world.resume(state["cp"])
    send(b, 3, 4)
    state.update(pos=4, cp=b.checkpoint())  # the owner stores: confirmed
    send(a, 3, 6)  # the zombie wakes: its records carry the generation B fenced
    with pytest.raises(ProducerFenced, match="was replaced") as refused:
        a.checkpoint()
    assert not refused.value.retriable
    assert a.state is LeaseState.FENCED
    with pytest.raises(ProducerFenced):
        a.produce("t", b"late", partition=0)  # a replaced instance sends nothing more
    c = world.resume(state["cp"])  # B died: C resumes what B stored
    send(c, state["pos"], len(EVENTS))
    assert Counter(world.appended()) == Counter(EVENTS)


def test_an_instance_whose_ended_pid_a_resume_rolled_on_is_replaced_too() -> None:
    """B resumed after A's lease ended: the resume rolled A's pid (retired at A's generation)
    and continues under its successor; A's checkpoint is refused all the same."""
    world = World()
    a = world.producer()
    send(a, 0, 2)
    cp = a.checkpoint()
    world.lease.tick(cp.expire_ms + 1)
    b = world.resume(cp)
    assert b.resumed_how == "rolled"
    with pytest.raises(ProducerFenced, match="rolled it into a successor"):
        a.checkpoint()
    b.checkpoint()


def test_the_owner_checkpoints_after_its_lease_a_bump_a_resume_and_a_rollover() -> None:
    world = World()
    a = world.producer()
    send(a, 0, 2)
    a.checkpoint()
    a.bump()
    assert a.checkpoint().generation == a.sequencer.generation
    b = world.resume(a.checkpoint())
    b.checkpoint()
    successor = b.roll()
    assert b.checkpoint().pid == successor.pid != a.sequencer.pid
    assert world.lease.counts["described"] >= 5  # each was asked, none refused


def test_an_unknown_answer_proves_no_fencing_and_is_accepted() -> None:
    """Past the lineage retention the authority no longer knows the pid (nor whether anybody
    resumed it): nothing shows a replacement, so the checkpoint stands."""
    world = World()

    class Forgetful:
        def __getattr__(self, name: str) -> Any:
            return getattr(world.lease, name)

        def describe(self, pid: int) -> PidStatus:
            return PidStatus.unknown(pid)

    a = world.producer(Forgetful())
    send(a, 0, 1)
    assert a.checkpoint().next_seq == {("t", 0): 1}


def test_no_lease_server_answer_stores_nothing_and_changes_nothing() -> None:
    world = World()
    a = world.producer()
    send(a, 0, 1)
    world.lease.down_until = world.lease.now + 1000
    with pytest.raises(LeaseServerDown) as down:
        a.checkpoint()
    assert down.value.retriable and a.state is LeaseState.LEASED
    world.lease.down_until = 0
    assert a.checkpoint().next_seq == {("t", 0): 1}


class Flaky:
    """The lease servers, whose ``describe`` fails for the calls numbered in ``down``."""

    def __init__(self, server: SimLeaseServer, down: set[int]) -> None:
        self.server, self.down, self.calls = server, down, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)

    def describe(self, pid: int) -> PidStatus:
        self.calls += 1
        if self.calls in self.down:
            raise LeaseServerUnreachable("no lease server answered")
        return self.server.describe(pid)


def test_periodic_saves_skip_while_no_lease_server_answers_and_log_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pidfence.producer.opening import PeriodicCheckpoints  # new with this test

    world = World()
    client = Flaky(world.lease, {2, 3})
    producer = world.producer(client)
    saves = PeriodicCheckpoints("state file s.json")
    with caplog.at_level(logging.WARNING, logger="pidfence.producer.opening"):
        taken = [saves.take(producer) for _ in range(4)]
    assert [cp is not None for cp in taken] == [True, False, False, True]
    assert saves.skipped == 2
    assert [r.message.count("not saving state file s.json") for r in caplog.records] == [1]
    client.down = {5}
    with pytest.raises(LeaseServerDown):
        saves.take(producer, last=True)  # the save before the process ends is not skipped


def spec(count: int) -> LoadSpec:
    return LoadSpec(name="p", topic="t", count=count, value_size=20, keys=0, checkpoint_every=10)


def test_the_load_generator_skips_saves_while_no_lease_server_answers(tmp_path: Path) -> None:
    world = World()
    client = Flaky(world.lease, {2, 3})  # the saves at records 10 and 20 (the 1st: at open)
    path = tmp_path / "s.json"
    saved: list[int] = []
    generator = LoadGenerator(spec(40), lambda cp: world.producer(client), path)
    result = generator.run(on_progress=lambda done: saved.append(load_state(path)["next_i"]))
    assert result.next_i == 40
    assert saved == [0, 0, 30, 40, 40]  # progress at 10 and 20 not stored; then caught up


def test_a_replaced_load_generator_stops_without_overwriting_its_replacements_state(
    tmp_path: Path,
) -> None:
    """The load generator behind ``pidfence produce --state``: a replacement resumes its state
    file mid-run and stores its own; the replaced instance's next save is refused."""
    world = World()
    path = tmp_path / "s.json"
    taken_over: list[int] = []

    def take_over(done: int) -> None:
        if done == 20 and not taken_over:
            data = load_state(path)
            heir = world.resume(ProducerCheckpoint.from_dict(data["checkpoint"]))
            taken_over.append(data["next_i"])
            heir.close()

    generator = LoadGenerator(spec(40), lambda cp: world.producer(), path)
    with pytest.raises(ProducerFenced, match="replaced"):
        generator.run(on_progress=take_over)
    assert taken_over == [20] and load_state(path)["next_i"] == 20


def test_a_lease_server_too_old_to_describe_is_named() -> None:
    world = World()

    class Old:
        def __getattr__(self, name: str) -> Any:
            return getattr(world.lease, name)

        def describe(self, pid: int) -> PidStatus:
            raise UnknownOp("unknown op 'describe'")

    producer = world.producer(Old())
    with pytest.raises(ProducerError, match="upgrade the lease servers") as old:
        producer.checkpoint()
    assert not old.value.retriable
