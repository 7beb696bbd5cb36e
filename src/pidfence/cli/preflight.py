"""What the commands check before they start a JVM: Kafka (and ZooKeeper) answer, the topics
exist, their records carry ``pf`` headers, and the paths named on the command line are writable.

Each failed check is a :class:`PreflightError` whose message is the one line the user sees. What
the sink itself requires of its output and checkpoint (the table format, the owner, where a run
starts) is the library's: :mod:`pidfence.spark_sink.preflight`.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pidfence.reachability import REFUSED_GRACE_S, refused_everywhere, zookeeper_servers
from pidfence.wire import PF_HEADER_KEY, PidfenceError

#: How long the metadata request may take before Kafka counts as unreachable.
METADATA_TIMEOUT_S = 10.0
#: Records sampled (from the end of each partition) to look for ``pf`` headers.
SAMPLE_RECORDS = 200


class PreflightError(PidfenceError):
    """A check before the start failed; the message says what, where and what to do."""

    retriable: ClassVar[bool] = False


class KafkaUnreachable(PreflightError):
    """No broker answered a metadata request in time."""


class KafkaNotReady(KafkaUnreachable):
    """Kafka answered, but not for all of a topic: a partition without a leader (a broker
    down), or an error Kafka calls retriable. A rerun may find it ready."""

    retriable: ClassVar[bool] = True


class ZooKeeperUnreachable(PreflightError):
    """No ZooKeeper server answered in time."""


class TopicMissing(PreflightError):
    """A topic to read does not exist."""


class TopicRefused(PreflightError):
    """Kafka answered for a topic with an error a rerun meets again (not authorized, an
    invalid name)."""


class PathUnusable(PreflightError):
    """The output or checkpoint path cannot be written, or another query owns it."""


@dataclass
class TopicReport:
    """What the Kafka check found.

    Attributes:
        watermarks: (topic, partition) -> (low, high) offsets.
        sampled: records looked at for a ``pf`` header.
        with_pf: how many of them had one.
        timestamp_types: topic -> its ``message.timestamp.type`` (``CreateTime`` or
            ``LogAppendTime``; missing when Kafka did not say).
    """

    watermarks: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    sampled: int = 0
    with_pf: int = 0
    timestamp_types: dict[str, str] = field(default_factory=dict)

    def create_time_warning(self) -> str | None:
        """With lease signing: a warning naming the topics whose records carry the producer's
        own timestamp (``CreateTime``), at which certificate expiry is then judged."""
        topics = sorted(t for t, kind in self.timestamp_types.items() if kind == "CreateTime")
        if not topics:
            return None
        names = ", ".join(topics)
        return (
            f"{names} use CreateTime: a certificate's expiry is judged at the record's timestamp, "
            "which the writer sets, so a writer who back-dates a record can use an expired "
            "certificate on a partition where the sink has seen nothing newer. Set "
            "message.timestamp.type=LogAppendTime on the topic (kafka-configs --alter "
            "--entity-type topics --add-config message.timestamp.type=LogAppendTime); topics "
            "pidfence creates use it"
        )

    @property
    def no_pf_warning(self) -> str | None:
        """A warning when a non-empty sample had no ``pf`` header at all."""
        if self.sampled and not self.with_pf:
            return (
                f"none of the {self.sampled} newest records has a `pf` header: they will be "
                "appended as NON_IDEMPOTENT without deduplication (write them with "
                "pidfence.producer.IdempotentProducer)"
            )
        return None


def check_kafka(
    bootstrap: str, topics: list[str], timeout_s: float = METADATA_TIMEOUT_S
) -> TopicReport:
    """Ask Kafka for the topics' metadata and watermarks, and sample their newest records.

    Raises:
        KafkaUnreachable: no answer within ``timeout_s``.
        KafkaNotReady: a partition has no leader, or Kafka's answer for a topic is an error it
            calls retriable (retriable).
        TopicMissing: a topic does not exist.
        TopicRefused: Kafka's answer for a topic is an error a rerun meets again.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    if refused_everywhere(bootstrap):
        raise KafkaUnreachable(
            f"cannot reach Kafka at {bootstrap}: connection refused for {REFUSED_GRACE_S:g} s "
            "(is it running? check --bootstrap)"
        )
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "pidfence-sink-preflight",
        "enable.auto.commit": False,
        "log_level": 0,  # librdkafka's own connection errors would repeat our one line
        "logger": _Silent(),
    }
    try:
        consumer: Any = Consumer(conf)
    except KafkaException as exc:
        raise KafkaUnreachable(f"bad Kafka configuration --bootstrap {bootstrap}: {exc}") from exc
    try:
        try:
            meta = consumer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaUnreachable(
                f"cannot reach Kafka at {bootstrap}: no broker answered within {timeout_s:g} s "
                "(is it running? check --bootstrap)"
            ) from exc
        report = TopicReport()
        for topic in topics:
            info = meta.topics.get(topic)
            error = None if info is None else info.error
            if error is not None and error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _refusal(error, f"topic {topic!r} on Kafka at {bootstrap}")
            if info is None or error is not None or not info.partitions:
                known = sorted(t for t in meta.topics if not t.startswith("__"))
                hint = f" (topics there: {', '.join(known[:8])})" if known else ""
                raise TopicMissing(
                    f"topic {topic!r} does not exist on Kafka at {bootstrap}{hint}; create it first"
                )
            for partition in sorted(info.partitions):
                where = f"the offsets of {topic!r} partition {partition} on Kafka at {bootstrap}"
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout_s
                    )
                except KafkaException as exc:
                    raise _refusal(exc.args[0] if exc.args else None, where) from exc
                report.watermarks[(topic, partition)] = (int(low), int(high))
        _sample(consumer, report)
        report.timestamp_types = _timestamp_types(bootstrap, topics, timeout_s)
        return report
    finally:
        consumer.close()


#: Kafka's errors that its protocol calls retriable, as a topic's metadata or a partition's
#: offsets may carry them (librdkafka does not flag these as retriable), and the client's own
#: for a broker that did not answer.
_RETRIABLE_KAFKA = frozenset(
    {
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "REPLICA_NOT_AVAILABLE",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "KAFKA_STORAGE_ERROR",
        "LISTENER_NOT_FOUND",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "OFFSET_NOT_AVAILABLE",
        "PREFERRED_LEADER_NOT_AVAILABLE",
        "_TIMED_OUT",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
    }
)


def _refusal(error: Any, where: str) -> PreflightError:
    """Kafka's ``error`` (a ``KafkaError``) for ``where``, as it is: :class:`KafkaNotReady` when
    Kafka or its protocol calls it retriable, else :class:`TopicRefused`."""
    try:
        name, text, flagged = error.name(), error.str(), bool(error.retriable())
    except AttributeError:  # not a KafkaError: its class and text say what it is
        name, text, flagged = type(error).__name__, str(error), False
    if flagged or name in _RETRIABLE_KAFKA:
        return KafkaNotReady(
            f"{where}: {name} ({text}), which passes (a partition without a leader while a "
            "broker is down, or one moving); run again once the brokers are up"
        )
    return TopicRefused(f"{where}: {name} ({text}); check the topic and the client's access")


def _timestamp_types(bootstrap: str, topics: list[str], timeout_s: float) -> dict[str, str]:
    """Each topic's ``message.timestamp.type`` (empty where Kafka does not answer in time)."""
    if not topics:
        return {}  # describe_configs refuses an empty list (pidfence demo checks no topic)
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0, "logger": _Silent()}
    admin = AdminClient(conf)
    found: dict[str, str] = {}
    futures = admin.describe_configs([ConfigResource("topic", t) for t in topics])
    for resource, future in futures.items():
        try:
            entry = future.result(timeout=timeout_s).get("message.timestamp.type")
        except (KafkaException, TimeoutError, ValueError):
            continue
        if entry is not None and entry.value:
            found[resource.name] = str(entry.value)
    return found


def check_zookeeper(hosts: str, timeout_s: float = METADATA_TIMEOUT_S) -> None:
    """Open and close a ZooKeeper session.

    Raises:
        ZooKeeperUnreachable: no session within ``timeout_s``.
    """
    import logging

    from kazoo.client import KazooClient

    if refused_everywhere(zookeeper_servers(hosts)):
        raise ZooKeeperUnreachable(
            f"cannot reach ZooKeeper at {hosts}: connection refused for {REFUSED_GRACE_S:g} s "
            "(is it running? check --zk)"
        )
    quiet = logging.getLogger("pidfence.preflight.kazoo")
    quiet.setLevel(logging.CRITICAL)
    try:
        client = KazooClient(hosts=hosts, timeout=timeout_s, connection_retry=None, logger=quiet)
    except ValueError as exc:
        raise ZooKeeperUnreachable(f"bad ZooKeeper connect string {hosts!r}: {exc}") from exc
    try:
        client.start(timeout=timeout_s)
    except Exception as exc:  # kazoo: timeouts and socket errors both mean "not reachable"
        raise ZooKeeperUnreachable(
            f"cannot reach ZooKeeper at {hosts}: no session within {timeout_s:g} s "
            "(is it running? check --zk)"
        ) from exc
    finally:
        client.stop()
        client.close()


class _Silent:
    """A logging.Logger stand-in that drops librdkafka's log lines."""

    def log(self, *args: object, **kwargs: object) -> None:
        """Ignore."""


def _sample(consumer: Any, report: TopicReport, budget_s: float = 3.0) -> None:
    from confluent_kafka import TopicPartition

    non_empty = [(tp, lh) for tp, lh in report.watermarks.items() if lh[1] > lh[0]]
    if not non_empty:
        return
    per = max(1, SAMPLE_RECORDS // len(non_empty))
    assignment = [TopicPartition(t, p, max(low, high - per)) for (t, p), (low, high) in non_empty]
    wanted = sum(min(per, high - low) for _, (low, high) in non_empty)
    consumer.assign(assignment)
    deadline = time.monotonic() + budget_s
    while report.sampled < wanted and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=wanted, timeout=0.5):
            if msg.error() is not None:
                continue
            report.sampled += 1
            if any(key == PF_HEADER_KEY for key, _ in msg.headers() or []):
                report.with_pf += 1


def check_writable(path: str, what: str) -> None:
    """Create ``path`` (a local folder) if needed and prove a file can be written in it.

    Remote URIs (``s3://`` …) are left to the sink.

    Raises:
        PathUnusable: it is a file, or cannot be created or written.
    """
    if "://" in path and not path.startswith("file://"):
        return
    local = Path(path.removeprefix("file://"))
    if local.exists() and not local.is_dir():
        raise PathUnusable(f"{what} {local} is a file, not a folder; choose another --{what}")
    try:
        local.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".pidfence-probe-", dir=local)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PathUnusable(
            f"{what} {local} is not writable ({reason}); choose another --{what} or fix its "
            "permissions"
        ) from exc
