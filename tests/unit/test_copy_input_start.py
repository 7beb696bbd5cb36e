"""Where a copy resumes an input partition when Kafka deleted records it had not copied
(``pidfence.producer.input_start``): refused by name, or skipped with ``allow_data_loss`` where
nothing the resumed producer owes could take the deleted records' places."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import confluent_kafka
import pytest

from pidfence.cli.exits import code_of
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.copier import Copier, CopySpec
from pidfence.producer.copy_task import CopyTask
from pidfence.producer.errors import BrokerUnavailable, KafkaRefused, UnknownTopic
from pidfence.producer.input_start import (
    InputRecordsDeleted,
    check_jump,
    raise_for,
    start_offset,
)
from tests.unit.kafka_kit import Message
from tests.unit.test_copy_group import CODEC, TARGET, FakeProducer, Member, records


def test_a_stored_offset_inside_the_log_is_where_the_copy_resumes() -> None:
    for stored in (10, 15, 20):
        assert start_offset("in", 0, stored, (10, 20), allow_data_loss=False) == stored


def test_offsets_deleted_before_the_copy_read_them_are_named() -> None:
    with pytest.raises(InputRecordsDeleted, match=r"in\[2\]: Kafka deleted offsets 4..9 ") as e:
        start_offset("in", 2, 4, (10, 20), allow_data_loss=False)
    assert "--allow-data-loss" in str(e.value)


def test_an_offset_past_the_end_says_the_topic_may_have_been_created_again() -> None:
    with pytest.raises(InputRecordsDeleted, match="past the log's end"):
        start_offset("in", 0, 30, (0, 20), allow_data_loss=False)


def test_allowed_data_loss_continues_at_the_log_start() -> None:
    assert start_offset("in", 0, 4, (10, 20), allow_data_loss=True) == 10


def test_an_offset_past_the_end_is_refused_even_when_data_loss_is_allowed() -> None:
    """A truncated log or a topic created again: its start would copy again what was copied,
    under new seqs (every record twice downstream)."""
    with pytest.raises(InputRecordsDeleted, match="copy into a new output topic"):
        start_offset("in", 0, 30, (10, 20), allow_data_loss=True)


def owing(
    skip: int = 0, resend: list[tuple[int, int]] | None = None, ahead: int = 0, next_seq: int = 5
) -> Any:
    """A resumed producer on out[0] at ``next_seq`` whose recovery owes ``skip`` places (and
    ``resend``), or saw its own records land up to ``ahead`` (a resume under the same pid)."""
    tp = (TARGET, 0)
    return SimpleNamespace(
        sequencer=SimpleNamespace(
            skip={tp: skip} if skip else {},
            resend={tp: resend} if resend else {},
            ahead={tp: ahead} if ahead else {},
            peek=lambda topic, partition: next_seq,
        )
    )


def test_a_jump_is_refused_while_the_producer_owes_places_to_records_copied_before() -> None:
    for producer in (owing(skip=3), owing(resend=[(2, 1)]), owing(ahead=8, next_seq=5)):
        with pytest.raises(InputRecordsDeleted, match="Copy into a new output topic"):
            check_jump(producer, TARGET, 0, stored=4, start=10)
    check_jump(owing(), TARGET, 0, stored=4, start=10)  # nothing owed: the jump is clean
    check_jump(owing(ahead=5, next_seq=5), TARGET, 0, stored=4, start=10)  # nothing past it
    check_jump(owing(skip=3), TARGET, 0, stored=4, start=4)  # no jump


def error_of(code: int) -> confluent_kafka.KafkaError:
    return confluent_kafka.KafkaError(code, "broker says so")


def test_the_consumers_errors_mean_what_they_say() -> None:
    raise_for(error_of(confluent_kafka.KafkaError._PARTITION_EOF), "in", 0)
    with pytest.raises(InputRecordsDeleted, match=r"in\[3\]: Kafka deleted records"):
        raise_for(error_of(confluent_kafka.KafkaError._AUTO_OFFSET_RESET), "in", 3)
    with pytest.raises(BrokerUnavailable, match="consuming in failed"):
        raise_for(error_of(confluent_kafka.KafkaError._TRANSPORT), "in", 0)
    # A rerun meets these again: exit 3, not the 75 that promises a rerun continues.
    with pytest.raises(KafkaRefused, match="grant this client's principal READ") as denied:
        raise_for(error_of(confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED), "in", 0)
    assert code_of(denied.value) == 3


def gone(topic: str) -> int:
    raise UnknownTopic(topic)


@pytest.mark.parametrize(
    ("partitions", "error", "code"),
    [
        (gone, KafkaRefused, 3),  # metadata confirms it: the input topic was deleted
        (lambda topic: 2, BrokerUnavailable, 75),  # it is there: a broker's metadata lagged
        (None, BrokerUnavailable, 75),  # no way to ask
    ],
)
def test_an_unknown_input_topic_is_gone_only_once_metadata_confirms_it(
    partitions: Any, error: type[Exception], code: int
) -> None:
    with pytest.raises(error) as raised:
        unknown = error_of(confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART)
        raise_for(unknown, "in", 0, partitions)
    assert code_of(raised.value) == code
    if code == 3:
        assert "deleted while copying" in str(raised.value)


def test_a_refusing_guard_closes_the_task_producer_and_commits_nothing() -> None:
    commits: list[int] = []
    producer: Any = FakeProducer(0, 10)

    def refuse(opened: Any) -> None:
        raise InputRecordsDeleted("refused")

    with pytest.raises(InputRecordsDeleted):
        CopyTask.open(
            0,
            TARGET,
            (4, ProducerCheckpoint(7, 9, 2**45, {(TARGET, 0): 4})),
            0,
            lambda checkpoint, output: producer,
            lambda partition, offset, checkpoint: commits.append(offset),
            refuse,
        )
    assert producer.closed and commits == []


def member_resuming_below_the_log_start(**spec: Any) -> Member:
    """A member whose group committed partition 0 at offset 40; retention moved its log start
    to 45, and records 45..46 are there to copy."""
    member = Member([("assign", [0]), records(0, range(45, 47))], **spec)
    member.consumer.commits[0] = (40, CODEC.encode(0, ProducerCheckpoint(7, 55, 2**45, {})))
    ends = member.consumer.ends
    member.consumer.get_watermark_offsets = lambda tp, timeout: (45, ends.get(tp.partition, 0))  # type: ignore[method-assign]
    return member


def test_a_group_member_refuses_a_commit_below_the_log_start() -> None:
    member = member_resuming_below_the_log_start()
    with pytest.raises(InputRecordsDeleted, match=r"Kafka deleted offsets 40\.\.44"):
        member.group.run()
    assert member.consumer.commits[0][0] == 40  # nothing moved past the deleted records


def test_a_group_member_allowed_to_lose_data_continues_at_the_log_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    member = member_resuming_below_the_log_start(allow_data_loss=True)
    monkeypatch.setattr(FakeProducer, "sequencer", owing().sequencer, raising=False)
    member.group.run()
    assert member.consumer.log[:2] == ["commit 0 at 45", "fetch 0 from 45"]
    assert member.committed(0)[0] == 47


class OneCopyConsumer:
    """The single copier's consumer: two input partitions whose logs start at 5 and 7; it
    hands out ``script`` (records, or error events), then nothing."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.assigned: list[tuple[int, int]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        info = SimpleNamespace(error=None, partitions=dict.fromkeys(range(2)))
        return SimpleNamespace(topics={topic: info})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return (5, 50) if tp.partition == 0 else (7, 70)

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in tps]

    def poll(self, timeout: float) -> Any:
        return self.script.pop(0) if self.script else None

    def close(self) -> None:
        pass


class ErrorEvent(Message):
    """A consumer error event on partition 0."""

    def error(self) -> Any:  # type: ignore[override]
        return confluent_kafka.KafkaError(confluent_kafka.KafkaError._AUTO_OFFSET_RESET, "gone")


def copier_over(consumer: OneCopyConsumer, state: Path) -> Copier:
    clock = iter(range(0, 10_000, 5))  # each look at the clock 5 s on: idle at once
    producer = FakeProducer(0, 10)
    producer.sequencer = owing()  # type: ignore[attr-defined]
    producer.partition_count = lambda topic: 2  # type: ignore[attr-defined]
    return Copier(
        CopySpec("kafka:9092", "in", TARGET, idle_exit_s=1.0),
        lambda checkpoint: cast(Any, producer),
        state,
        consumer_factory=lambda conf: consumer,
        clock=lambda: float(next(clock)),
    )


def test_a_fresh_copy_stores_where_each_input_partition_started(tmp_path: Path) -> None:
    """Stored from the first save, each partition's start is checked by every resume: one not
    read before the copier stopped used to start wherever the log started by then, without a
    word for what retention deleted in between."""
    consumer = OneCopyConsumer([])
    copier_over(consumer, tmp_path / "s.json").run()
    assert consumer.assigned == [(0, 5), (1, 7)]
    assert json.loads((tmp_path / "s.json").read_text())["offsets"] == {"0": 5, "1": 7}


def test_retention_overtaking_a_running_copy_saves_before_it_refuses(tmp_path: Path) -> None:
    """Saved, the copy owes nothing past its checkpoint, so --allow-data-loss can go on."""
    record = Message("in", 0, 5, value_=b"r5")
    consumer = OneCopyConsumer([record, ErrorEvent("in", 0)])
    with pytest.raises(InputRecordsDeleted, match=r"in\[0\]: Kafka deleted records"):
        copier_over(consumer, tmp_path / "s.json").run()
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["copied"] == 1 and saved["offsets"] == {"0": 6, "1": 7}
