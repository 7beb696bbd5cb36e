"""``ProducerConfig``: the producer's settings as a frozen dataclass exporting librdkafka keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pidfence.producer.errors import ProducerConfigError

_SECRET_WORDS = ("password", "secret", "token", "key.password", "sasl.oauthbearer")
_OWNED = {
    "bootstrap.servers",
    "acks",
    "enable.idempotence",
    "message.max.bytes",
    "linger.ms",
    "delivery.report.only.error",
    "message.timeout.ms",
    # librdkafka's alias of message.timeout.ms: through extra= it would override it.
    "delivery.timeout.ms",
}


def _is_secret(key: str) -> bool:
    return any(word in key for word in _SECRET_WORDS)


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of an :class:`~pidfence.producer.IdempotentProducer`.

    Attributes:
        bootstrap_servers: Kafka ``host:port[,host:port]``.
        acks: must be ``"all"`` (or ``"-1"``): a record acknowledged by one replica only can be
            lost on leader failover, and a lost record is a gap no dedup can repair.
        enable_idempotence: librdkafka's own idempotence, on by default so one session's records
            reach the broker in order; turn it off (e.g. for brokers that refuse it) and the sink's
            reorder window absorbs small reorderings.
        linger_ms: librdkafka ``linger.ms``.
        message_max_bytes: largest record value accepted (librdkafka ``message.max.bytes``).
        rollover_fraction: lease a new pid after this fraction of the lease lifetime (23/24).
        default_lifetime_ms: lifetime assumed when a resumed checkpoint does not carry one.
        metadata_timeout_s: wait for topic metadata (partition counts) at first use of a topic.
        sticky_records: unkeyed records stick to one partition for this many records, then
            move round-robin to the next (Kafka's sticky partitioner, counted in records).
        resend_buffer: acknowledged records kept per partition for ``resend_acknowledged`` (a
            fault hook for demos and tests; 0, the default, keeps none).
        message_timeout_ms: librdkafka ``message.timeout.ms``: a record not delivered this long
            after ``produce`` fails instead of being sent. Keep it below the rollover margin
            (``(1 - rollover_fraction)`` of the lease lifetime; the producer warns otherwise), so
            a process paused with records in flight never delivers them after its lease ended.
        clock_skew_ms: how far the clocks of the machines that write a topic may disagree; a
            resume's recovery scan starts this long before its checkpoint was taken (by the
            records' timestamps), so a record the checkpoint does not cover is not missed.
        success_reports: deliver a report for every acknowledged record (needed by the send
            ledger, the resend buffer and per-record ``on_delivery`` callbacks). ``False`` sets
            librdkafka's ``delivery.report.only.error``: failures are still reported (and
            raised by ``flush()``), successes cost no Python call; the producer then refuses a
            ledger, a resend buffer and ``on_delivery``.
        lease_public_keys: the lease servers' public keys (PEM files; several during a key
            rotation). When set, a resume's recovery scan checks ``pfc`` as the verifying sink
            does: a FENCE or a new pid without a valid certificate is ignored there (the sink
            calls it ``FORGED``), so a forged FENCE in the topic cannot make this producer
            re-send records under its successor pid. Set it whenever the sink verifies.
        restamp_ms: with lease signing, every partition's next record carries the lease's
            ``pfc`` again this often (besides every FENCE and the first record of each
            generation), so a sink that starts reading mid-stream (retention, ``latest``) can
            verify and adopt the producer within this bound; 0: never again.
        sink_resolves_gaps: the sink's ``resolveGaps`` option (on by default there too). A
            resume's recovery scan judges the topic with the sink's rules, so it must know whether
            the sink reports an overflowed hole as a gap and goes on, or holds what follows it.
        sink_timestamp_skew_ms: the sink's ``timestampSkew`` option (1 h by default there too):
            its entries live that long past a lease. A resume's recovery scan does not count a
            record of the checkpoint's generation stamped later than the lease's end plus this
            (or plus ``clock_skew_ms`` and ``message_timeout_ms``, if longer): none of the pid's
            own records is stamped then, and a sink whose entry expired refuses such a copy.
        extra: more librdkafka settings, passed through (secrets are masked in ``repr``).
    """

    bootstrap_servers: str
    acks: str = "all"
    enable_idempotence: bool = True
    linger_ms: int = 5
    message_max_bytes: int = 1_000_000
    rollover_fraction: float = 23 / 24
    default_lifetime_ms: int = 24 * 3600 * 1000
    metadata_timeout_s: float = 10.0
    sticky_records: int = 100
    resend_buffer: int = 0
    success_reports: bool = True
    lease_public_keys: tuple[str, ...] = ()
    message_timeout_ms: int = 300_000
    clock_skew_ms: int = 5_000
    restamp_ms: int = 1_000
    sink_resolves_gaps: bool = True
    sink_timestamp_skew_ms: int = 3_600_000
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        acks = str(self.extra.get("acks", self.acks)).lower()
        if acks not in ("all", "-1"):
            raise ProducerConfigError(
                f"acks={acks!r} can lose acknowledged records on leader failover; "
                "set acks='all' (ProducerConfig(acks='all'), the default)"
            )
        clash = sorted(_OWNED & set(self.extra) - {"acks"})
        if clash:
            raise ProducerConfigError(
                f"set {clash} through ProducerConfig's own fields, not extra="
            )
        if not 0 < self.rollover_fraction < 1:
            raise ProducerConfigError(
                f"rollover_fraction must be in (0, 1), got {self.rollover_fraction}"
            )
        if self.sticky_records < 1 or self.resend_buffer < 0 or self.message_max_bytes < 1:
            raise ProducerConfigError(
                "sticky_records >= 1, resend_buffer >= 0, message_max_bytes >= 1"
            )
        if self.restamp_ms < 0:
            raise ProducerConfigError(f"restamp_ms must be >= 0 (0: never), got {self.restamp_ms}")
        if self.message_timeout_ms < 1 or self.clock_skew_ms < 0 or self.sink_timestamp_skew_ms < 0:
            raise ProducerConfigError(
                f"message_timeout_ms must be >= 1, clock_skew_ms and sink_timestamp_skew_ms >= 0, "
                f"got {self.message_timeout_ms}, {self.clock_skew_ms} and "
                f"{self.sink_timestamp_skew_ms}"
            )
        if not self.success_reports and self.resend_buffer:
            raise ProducerConfigError(
                "the resend buffer is filled from success reports: set resend_buffer=0 with "
                "success_reports=False"
            )
        if not self.bootstrap_servers:
            raise ProducerConfigError("give bootstrap_servers as host:port[,host:port]")
        keys = self.lease_public_keys
        # frozen: normalise a single path or a list to the tuple the field promises.
        object.__setattr__(
            self, "lease_public_keys", (str(keys),) if isinstance(keys, str) else tuple(keys)
        )

    @property
    def scan_late_ms(self) -> int:
        """How long after a lease's end a resume's recovery scan still counts a record of it:
        the sink's entry life past the lease (``sink_timestamp_skew_ms``), or how late the
        pid's own records can be stamped (``clock_skew_ms`` plus ``message_timeout_ms``)."""
        return max(self.sink_timestamp_skew_ms, self.clock_skew_ms + self.message_timeout_ms)

    def to_librdkafka(self) -> dict[str, Any]:
        """The ``confluent_kafka.Producer`` configuration (dotted librdkafka keys)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": self.enable_idempotence,
            "linger.ms": self.linger_ms,
            "message.max.bytes": self.message_max_bytes + 4096,
            "message.timeout.ms": self.message_timeout_ms,
        }
        if not self.success_reports:
            conf["delivery.report.only.error"] = True
        conf.update({k: v for k, v in self.extra.items() if k != "acks"})
        return conf

    def __repr__(self) -> str:
        """Every setting, with librdkafka secrets in ``extra`` masked."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["extra"] = {k: ("***" if _is_secret(k) else v) for k, v in self.extra.items()}
        return f"ProducerConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"
