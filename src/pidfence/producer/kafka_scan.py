"""The recovery scan's reader over a real Kafka cluster (the decisions are in ``recovery``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import confluent_kafka

from pidfence.producer.checkpoint import TopicPartition
from pidfence.producer.client_log import librdkafka_logger
from pidfence.producer.errors import BrokerUnavailable
from pidfence.producer.recovery import ScanState

log = logging.getLogger(__name__)


class KafkaScanner:
    """A :class:`Scanner` over a real Kafka cluster (one short-lived consumer per resume).

    Args:
        conf: librdkafka settings for the consumer (bootstrap and security settings).
        timeout_s: per metadata / offset request, and how long the scan may read nothing
            before it gives up (a scan that keeps reading runs until every partition's end).
        consumer_factory: builds the consumer (``confluent_kafka.Consumer``; another client
            with its interface).
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        timeout_s: float = 30.0,
        consumer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Consumer,
    ) -> None:
        self._conf = dict(conf)
        self._timeout_s = timeout_s
        self._factory = consumer_factory

    def __call__(
        self,
        state: ScanState,
        partitions: Iterable[TopicPartition],
        since_ms: int,
        until: Mapping[TopicPartition, int],
    ) -> None:
        """Feed ``state`` the records of ``partitions`` (a :data:`~.recovery.Scanner`).

        Raises:
            BrokerUnavailable: Kafka did not answer within the timeout (retriable).
        """
        consumer = self._factory(
            {
                **self._conf,
                "group.id": "pidfence-recovery",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": librdkafka_logger(),
            }
        )
        try:
            self._scan(consumer, list(partitions), since_ms, until, state)
        except confluent_kafka.KafkaException as exc:
            raise BrokerUnavailable(
                f"the resume's recovery scan could not read Kafka ({exc}); resume again"
            ) from exc
        finally:
            consumer.close()

    def _scan(
        self,
        consumer: Any,
        partitions: list[TopicPartition],
        since_ms: int,
        until: Mapping[TopicPartition, int],
        state: ScanState,
    ) -> None:
        wanted = [confluent_kafka.TopicPartition(t, p, since_ms) for t, p in partitions]
        starts = consumer.offsets_for_times(wanted, timeout=self._timeout_s)
        ends: dict[TopicPartition, int] = {}
        assign = []
        for start in starts:
            tp = (start.topic, start.partition)
            low, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(*tp), timeout=self._timeout_s
            )
            end = until.get(tp, high)
            if start.offset < 0 or start.offset >= end:
                continue  # nothing written since the checkpoint
            if low > 0 and start.offset <= low:
                # What came before the first offset left is unknown (below it: retention moved
                # between the two lookups).
                state.head_deleted(tp)
            ends[tp] = end
            assign.append(
                confluent_kafka.TopicPartition(start.topic, start.partition, start.offset)
            )
        if not assign:
            return
        consumer.assign(assign)
        open_parts = set(ends)
        idle = 0
        while open_parts:
            msg = consumer.poll(1.0)
            if msg is None:
                idle += 1
                if idle > self._timeout_s:
                    raise BrokerUnavailable(
                        f"the recovery scan read nothing for {self._timeout_s}s; resume again"
                    )
                continue
            idle = 0
            tp = (msg.topic(), msg.partition())
            if msg.error() is not None:
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    open_parts.discard(tp)
                    continue
                raise confluent_kafka.KafkaException(msg.error())
            if tp not in open_parts:
                continue
            if msg.offset() >= ends[tp]:
                open_parts.discard(tp)
                continue
            state.note(tp, msg.headers(), msg.timestamp()[1], msg.key(), msg.value())
            if msg.offset() + 1 >= ends[tp]:
                open_parts.discard(tp)


def consumer_conf(producer_conf: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer settings a producer's librdkafka settings imply (bootstrap, security)."""
    keep = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.")
    return {k: v for k, v in producer_conf.items() if k.startswith(keep)}
