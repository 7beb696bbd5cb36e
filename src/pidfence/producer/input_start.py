"""Where a copy reads an input partition from, checked against what Kafka still holds.

A copier resumes each input partition at the offset its checkpoint stored. If retention deleted
records there before they were copied (the copier stopped, or fell behind, for longer than the
input's retention), those records cannot be copied any more. Kafka's consumer would silently
jump to the log start (``auto.offset.reset``); the copier refuses instead, naming the offsets,
as the sink does for its input (docs/gaps.md, "Retention while the sink is stopped"). With
``allow_data_loss`` (``pidfence copy --allow-data-loss``) it continues at the log start and logs
the offsets it could not copy, unless records it copied after its checkpoint landed (their
places would go to the records after the deleted ones: :func:`check_jump`). A stored offset past
the log's end is refused either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import confluent_kafka

from pidfence.producer.errors import BrokerUnavailable, KafkaRefused, ProducerError, UnknownTopic

_log = logging.getLogger(__name__)

#: Every consumer of a copy: a stored offset outside the log is an error, never a silent jump.
OFFSET_RESET = "error"


class InputRecordsDeleted(ProducerError):
    """Kafka deleted input records before the copier read them (or the offset it resumes at is
    past the log's end: the input topic was deleted and created again). Not retriable: a rerun
    meets the same offsets; ``--allow-data-loss`` continues after them."""


def _deleted(topic: str, partition: int, stored: int, low: int, high: int) -> str:
    if stored > high:
        return (
            f"{topic}[{partition}]: the copy resumes at offset {stored}, past the log's end "
            f"({high}): was the input topic deleted and created again?"
        )
    return (
        f"{topic}[{partition}]: Kafka deleted offsets {stored}..{low - 1} before the copier read "
        "them (retention ran while it was stopped or behind); they cannot be copied"
    )


def start_offset(
    topic: str, partition: int, stored: int, log: tuple[int, int], allow_data_loss: bool
) -> int:
    """The offset to read ``topic[partition]`` from, given the ``stored`` next offset and the
    ``log``'s (start, end) offsets as Kafka reports them.

    Raises:
        InputRecordsDeleted: ``stored`` is below the log's start (and not ``allow_data_loss``),
            or past its end (always).
    """
    low, high = log
    if low <= stored <= high:
        return stored
    why = _deleted(topic, partition, stored, low, high)
    if stored > high:
        # A truncated log (an unclean leader election) or a topic created again: starting over
        # at its start would copy again what was copied, under new seqs.
        raise InputRecordsDeleted(f"{why}; copy into a new output topic")
    if not allow_data_loss:
        raise InputRecordsDeleted(f"{why}; rerun with --allow-data-loss to continue after them")
    _log.warning("%s; continuing at offset %d (--allow-data-loss)", why, low)
    return low


def check_jump(producer: Any, to_topic: str, partition: int, stored: int, start: int) -> None:
    """Refuse to continue at ``start`` instead of ``stored`` when the resumed ``producer`` still
    owes positions on ``to_topic[partition]``: records it copied after its checkpoint landed,
    and a resume gives the next records read their places (the recovery's skip plan), so the
    records after the deleted ones would take the places of records that are gone.

    Raises:
        InputRecordsDeleted: records the producer sent after its checkpoint landed there.
    """
    if start == stored:
        return
    sequencer = producer.sequencer
    tp = (to_topic, partition)
    # A resume under the checkpoint's own pid keeps what landed after it as ``ahead`` (the next
    # records are DUPLICATE up to there); a successor skips it (``skip``, ``resend``).
    landed = sequencer.ahead.get(tp, 0) > sequencer.peek(*tp)
    if landed or sequencer.skip.get(tp, 0) or sequencer.resend.get(tp):
        raise InputRecordsDeleted(
            f"{to_topic}[{partition}]: records copied after the last checkpoint (from input "
            f"offset {stored}) are in the output, and Kafka deleted the input they came from: "
            "the copy cannot tell which records after them are new. Copy into a new output "
            "topic (a new --state, or a new --group)"
        )


def raise_for(
    error: Any, topic: str, partition: int, partitions: Callable[[str], int] | None = None
) -> None:
    """Raise the error a consumer's error event means (``_PARTITION_EOF`` is none).

    Args:
        partitions: a topic's partition count from a fresh metadata request (raising
            ``UnknownTopic`` when it does not exist): asked whether an unknown-topic error is
            a deleted input or a broker's metadata lagging (retriable).
    """
    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
        return
    if error.code() == confluent_kafka.KafkaError._AUTO_OFFSET_RESET:
        # Retention overtook the copier while it ran: the next run refuses by name at its start.
        raise InputRecordsDeleted(
            f"{topic}[{partition}]: Kafka deleted records before the copier read them ({error}); "
            "rerun with --allow-data-loss to continue after them"
        )
    code = error.code()
    if code in _GONE and partitions is not None:
        try:
            partitions(topic)
        except UnknownTopic:
            raise KafkaRefused(
                f"the input topic {topic!r} was deleted while copying ({error}): restore it, or "
                "copy into a new output topic (a new --state, or a new --group)",
                str(error.name()),
            ) from None
    if code in _DENIED:
        raise KafkaRefused(
            f"consuming {topic} was refused ({error}): grant this client's principal READ on the "
            "topic (and on its consumer group) and rerun",
            str(error.name()),
        )
    raise BrokerUnavailable(f"consuming {topic} failed: {error}")


#: Consumer errors a rerun meets again until someone acts (exit 3, not 75), the first ones
#: only once metadata confirms the topic is gone.
_GONE = frozenset(
    {confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, confluent_kafka.KafkaError._UNKNOWN_TOPIC}
)
_DENIED = frozenset(
    {
        confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
        confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED,
        confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
