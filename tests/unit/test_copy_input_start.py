"""Where a copy resumes an input partition when Kafka deleted records it had not copied
(``pidfence.producer.input_start``): refused by name, or skipped with ``allow_data_loss`` where
nothing the resumed producer owes could take the deleted records' places."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.copy_task import CopyTask
from pidfence.producer.errors import BrokerUnavailable
from pidfence.producer.input_start import (
    InputRecordsDeleted,
    check_jump,
    raise_for,
    start_offset,
)
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


@pytest.mark.parametrize("stored", [4, 30])
def test_allowed_data_loss_continues_at_the_log_start(stored: int) -> None:
    assert start_offset("in", 0, stored, (10, 20), allow_data_loss=True) == 10


def owing(skip: int = 0, resend: list[tuple[int, int]] | None = None) -> Any:
    """A resumed producer whose recovery owes ``skip`` places (and ``resend``) on out[0]."""
    tp = (TARGET, 0)
    return SimpleNamespace(
        sequencer=SimpleNamespace(
            skip={tp: skip} if skip else {}, resend={tp: resend} if resend else {}
        )
    )


def test_a_jump_is_refused_while_the_producer_owes_places_to_records_copied_before() -> None:
    for producer in (owing(skip=3), owing(resend=[(2, 1)])):
        with pytest.raises(InputRecordsDeleted, match="Copy into a new output topic"):
            check_jump(producer, TARGET, 0, stored=4, start=10)
    check_jump(owing(), TARGET, 0, stored=4, start=10)  # nothing owed: the jump is clean
    check_jump(owing(skip=3), TARGET, 0, stored=4, start=4)  # no jump


def error_of(code: int) -> confluent_kafka.KafkaError:
    return confluent_kafka.KafkaError(code, "broker says so")


def test_the_consumers_errors_mean_what_they_say() -> None:
    raise_for(error_of(confluent_kafka.KafkaError._PARTITION_EOF), "in", 0)
    with pytest.raises(InputRecordsDeleted, match=r"in\[3\]: Kafka deleted records"):
        raise_for(error_of(confluent_kafka.KafkaError._AUTO_OFFSET_RESET), "in", 3)
    with pytest.raises(BrokerUnavailable, match="consuming in failed"):
        raise_for(error_of(confluent_kafka.KafkaError._TRANSPORT), "in", 0)


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
