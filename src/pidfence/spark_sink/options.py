"""Options of ``format("pidfence")``: parsing and defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pidfence.broker_plugin import Verifier
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.wire.mac import RecordMacCheck
from pidfence.wire.statement import PlacedCheck

if TYPE_CHECKING:
    from pidfence.pid_allocator import LeaseClient

_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION: Final = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
DEFAULT_LIFETIME_MS: Final = 86_400_000
DEFAULT_CAPACITY: Final = 100_000
DEFAULT_REORDER_WINDOW: Final = 5
DEFAULT_COMPACT_EVERY: Final = 16
#: Kafka 4.x refuses CreateTime more than 1 h ahead (``log.message.timestamp.after.max.ms``).
DEFAULT_TIMESTAMP_SKEW_MS: Final = 3_600_000


def parse_duration_ms(text: str, name: str = "lifetime", low: int = 1) -> int:
    """``"3600000"``, ``"90s"``, ``"15m"``, ``"24h"`` or ``"7d"`` as milliseconds (>= ``low``)."""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) < low:
        kind = "positive " if low > 0 else ""
        raise SinkOptionError(
            f"{name} {text!r} is not a {kind}duration; use milliseconds or e.g. 90s, 15m, 24h"
        )
    return int(match.group(1)) * _UNITS[match.group(2) or "ms"]


def _int(options: dict[str, str], name: str, default: int, low: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SinkOptionError(f"option {name}={raw!r} must be an integer >= {low}") from None
    if value < low:
        raise SinkOptionError(f"option {name}={raw!r} must be an integer >= {low}")
    return value


def _bool(options: dict[str, str], name: str, default: bool = False) -> bool:
    raw = options.get(name, "true" if default else "false").strip().lower()
    if raw not in ("true", "false"):
        raise SinkOptionError(f"option {name}={raw!r} must be true or false")
    return raw == "true"


@dataclass(frozen=True)
class SinkOptions:
    """The sink's settings.

    Attributes:
        path: root of the output log (local path or a pyarrow.fs URI such as ``s3://b/p``).
        rejects_path: root of the rejects log (default ``<path>/_rejects``).
        lifetime_ms: producer entry lifetime (the lease lifetime).
        capacity: most live producers per partition.
        reorder_window: how far ahead of ``highwater + 1`` a record may wait for the gap.
        compact_every: a full state snapshot after this many incremental ones.
        flush_held: at the end of every batch, decide held records (``OUT_OF_ORDER``) instead of
            carrying them into the next batch.
        grace_ms: extra life of every producer entry: how far ahead of real time a record's
            timestamp may be (``timestampSkew``, default 1 h = Kafka's default bound), so no
            accepted record can expire a producer whose lease is live.
        lease_public_keys: PEM files of the lease servers' public keys (``leasePublicKey``,
            comma-separated); when set, records that would create an entry or move a generation
            need a valid ``pfc`` certificate, else they are ``FORGED``.
        resolve_gaps: when a producer's reorder window overflows, report the missing seqs as a
            gap and continue after them (``resolveGaps``, default true; false keeps the
            proposal's ``OUT_OF_ORDER`` for every later record).
        record_mac_secret: the lease servers' ``--record-mac-secret`` file
            (``recordMacSecret``): every idempotent record must then carry a valid per-record
            MAC (``pfm``), else it is ``FORGED`` (reason ``mac``).
        lease_servers: the lease servers ``HOST:PORT[,...]`` (``leaseServer``): where the sink
            could not see producers start it adopts only those they vouch for; unset, it adopts
            none (``UNKNOWN_PID``). Their auth token and TLS: ``leaseTokenFile``, ``leaseTlsCa``,
            ``leaseTlsCert``, ``leaseTlsKey`` (files every executor can read), else the
            environment, as producers read it.
    """

    path: str
    rejects_path: str
    lifetime_ms: int = DEFAULT_LIFETIME_MS
    capacity: int = DEFAULT_CAPACITY
    reorder_window: int = DEFAULT_REORDER_WINDOW
    compact_every: int = DEFAULT_COMPACT_EVERY
    flush_held: bool = False
    grace_ms: int = DEFAULT_TIMESTAMP_SKEW_MS
    lease_public_keys: tuple[str, ...] = ()
    resolve_gaps: bool = True
    record_mac_secret: str | None = None
    lease_servers: str | None = None
    lease_token_file: str | None = None
    lease_tls_ca: str | None = None
    lease_tls_cert: str | None = None
    lease_tls_key: str | None = None

    @classmethod
    def parse(cls, options: dict[str, str]) -> SinkOptions:
        """Validate Spark's option map (keys are case-insensitive in Spark; we accept both)."""
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise SinkOptionError(
                'the pidfence sink needs a path: .option("path", DIR) or .start(DIR)'
            )
        path = path.rstrip("/")
        lifetime = opts.get("lifetime")
        return cls(
            path=path,
            rejects_path=(opts.get("rejectspath") or f"{path}/_rejects").rstrip("/"),
            lifetime_ms=DEFAULT_LIFETIME_MS if lifetime is None else parse_duration_ms(lifetime),
            capacity=_int(opts, "capacity", DEFAULT_CAPACITY, 1),
            reorder_window=_int(opts, "reorderwindow", DEFAULT_REORDER_WINDOW, 0),
            compact_every=_int(opts, "compactevery", DEFAULT_COMPACT_EVERY, 0),
            flush_held=_bool(opts, "flushheld"),
            grace_ms=(
                DEFAULT_TIMESTAMP_SKEW_MS
                if opts.get("timestampskew") is None
                else parse_duration_ms(opts["timestampskew"], "timestampSkew", low=0)
            ),
            lease_public_keys=_keys(opts.get("leasepublickey")),
            resolve_gaps=_bool(opts, "resolvegaps", default=True),
            record_mac_secret=opts.get("recordmacsecret") or None,
            lease_servers=_servers(opts.get("leaseserver")),
            lease_token_file=opts.get("leasetokenfile") or None,
            lease_tls_ca=opts.get("leasetlsca") or None,
            lease_tls_cert=opts.get("leasetlscert") or None,
            lease_tls_key=opts.get("leasetlskey") or None,
        )

    def certificates(self) -> PlacedCheck | None:
        """The certificate check of the broker rules (None when ``leasePublicKey`` is unset);
        its :meth:`~pidfence.wire.statement.PlacedCheck.for_partition` is a table's verifier.

        Raises:
            SinkOptionError: a key file is missing or not an Ed25519 public key.
        """
        if not self.lease_public_keys:
            return None
        from pidfence.wire.cert import KeyFileError
        from pidfence.wire.statement import placed_check

        try:
            return placed_check(self.lease_public_keys)
        except KeyFileError as exc:
            raise SinkOptionError(f"option leasePublicKey: {exc}") from None

    def record_macs(self) -> RecordMacCheck | None:
        """The per-record MAC check (None when ``recordMacSecret`` is unset).

        Raises:
            SinkOptionError: the secret file is missing, readable by others, or malformed.
        """
        if not self.record_mac_secret:
            return None
        from pidfence.wire.cert import KeyFileError
        from pidfence.wire.mac import load_mac_secret

        try:
            return RecordMacCheck(load_mac_secret(self.record_mac_secret))
        except KeyFileError as exc:
            raise SinkOptionError(f"option recordMacSecret: {exc}") from None

    def lease_client(self) -> LeaseClient | None:
        """A client of the lease servers (None when ``leaseServer`` is unset).

        Raises:
            SinkOptionError: the token or TLS files are missing or unsafe.
        """
        if self.lease_servers is None:
            return None
        from pidfence.pid_allocator import SecretFileError
        from pidfence.spark_sink.authority import lease_client

        try:
            return lease_client(
                self.lease_servers,
                self.lease_token_file,
                self.lease_tls_ca,
                self.lease_tls_cert,
                self.lease_tls_key,
            )
        except SecretFileError as exc:
            raise SinkOptionError(f"option leaseServer: {exc}") from None

    def verifier(self, topic: str, partition: int) -> Verifier | None:
        """The broker rules' verifier of one (topic, partition), or None without signing."""
        check = self.certificates()
        return None if check is None else check.for_partition(topic, partition)


def _servers(raw: str | None) -> str | None:
    """``leaseServer``: ``HOST:PORT[,HOST:PORT]``, checked as ``LeaseClient`` reads it."""
    if raw is None or not raw.strip():
        return None
    from pidfence.pid_allocator import InvalidServerList
    from pidfence.pid_allocator.client import parse_servers

    try:
        parse_servers(raw)
    except InvalidServerList as exc:
        raise SinkOptionError(f"option leaseServer: {exc}") from None
    return raw.strip()


def _keys(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    paths = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not paths:
        raise SinkOptionError(
            "option leasePublicKey names no file; give PEM paths, comma-separated"
        )
    return paths
