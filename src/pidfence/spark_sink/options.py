"""Options of ``format("pidfence")``: each declared once, as a :class:`SinkOptions` field.

A field's :func:`option` names the Spark option (``reorderWindow``), its help and how its text is
read; :meth:`SinkOptions.parse` and the options table of ``docs/sink.md`` (:func:`options_table`;
a unit test keeps the page equal to it) are made from those declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pidfence import durations
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.wire.mac import RecordMacCheck
from pidfence.wire.statement import PlacedCheck

if TYPE_CHECKING:
    from pidfence.pid_allocator import LeaseClient


def parse_duration_ms(text: str, name: str = "duration", low: int = 1) -> int:
    """``"3600000"``, ``"90s"``, ``"15m"``, ``"24h"`` or ``"7d"`` as milliseconds, at least
    ``low`` once its unit is applied; ``name`` (the option read) begins the error's message.

    Raises:
        SinkOptionError: not a whole duration, or shorter than ``low``.
    """
    try:
        return durations.parse_duration_ms(text, low)
    except ValueError as exc:
        raise SinkOptionError(f"{name} {exc}") from None


def rejects_path_of(path: str, given: str | None = None) -> str:
    """The rejects table's root: ``given`` (the sink's ``rejectsPath``), else ``PATH/_rejects``."""
    return (given or f"{path.rstrip('/')}/_rejects").rstrip("/")


def option(
    default: Any, name: str, help: str, kind: str = "text", low: int = 0, shown: str = ""
) -> Any:
    """A sink option's field: its ``default``, its Spark option ``name``, its ``help``, how its
    text is read (``text``, ``int``, ``bool``, ``ms``: a duration, ``paths``: comma-separated
    files, or ``servers``: ``HOST:PORT[,...]``), the lowest allowed number, and the default as
    the docs show it (``shown``)."""
    meta = {"name": name, "help": help, "kind": kind, "low": low, "shown": shown}
    return field(default=default, metadata=meta)


def _read(meta: Mapping[str, Any], raw: str) -> Any:
    name, kind, low = meta["name"], meta["kind"], meta["low"]
    if kind == "ms":
        return parse_duration_ms(raw, name, low=low)
    if kind == "int":
        if not raw.strip().lstrip("-").isdigit() or int(raw) < low:
            raise SinkOptionError(f"option {name}={raw!r} must be an integer >= {low}")
        return int(raw)
    if kind == "bool":
        if raw.strip().lower() not in ("true", "false"):
            raise SinkOptionError(f"option {name}={raw!r} must be true or false")
        return raw.strip().lower() == "true"
    if kind == "servers":
        from pidfence.pid_allocator import InvalidServerList
        from pidfence.pid_allocator.client import parse_servers

        try:
            parse_servers(raw)
        except InvalidServerList as exc:
            raise SinkOptionError(f"option {name}: {exc}") from None
        return raw.strip() or None
    if kind == "paths":
        paths = tuple(p.strip() for p in raw.split(",") if p.strip())
        if not paths:
            raise SinkOptionError(f"option {name} names no file; give paths, comma-separated")
        return paths
    return raw or None


def _check_store(name: str, where: str) -> None:
    """Refuse a store without a create-if-absent the sink can use: its claims, manifests and
    owner record would be check-then-put, and two instances could both commit."""
    scheme, sep, _ = where.partition("://")
    if sep and scheme not in ("s3", "s3a", "file"):
        raise SinkOptionError(
            f"{name} {where}: the pidfence sink writes to a local disk or an S3-compatible store "
            f"(s3://, s3a://); {scheme}:// gives it no conditional create, so two sink instances "
            "could both commit a batch"
        )


@dataclass(frozen=True)
class SinkOptions:
    """The sink's settings: ``path`` and ``rejects_path``, then one field per option (see each
    declaration, or :func:`options_table`)."""

    path: str
    rejects_path: str
    lifetime_ms: int = option(
        86_400_000,
        "lifetime",
        "producer entry lifetime: the lease servers' `--lifetime` or longer (a shorter one "
        "forgets producers whose lease is live, and adopting one again could append its re-sends "
        "twice; with `leaseServer` set, a start asks them and refuses a shorter one)",
        "ms",
        1,
        "`24h`",
    )
    capacity: int = option(
        100_000, "capacity", "most live producers per partition (`CAPACITY` beyond it)", "int", 1
    )
    reorder_window: int = option(
        5, "reorderWindow", "how far past `highwater + 1` a record may wait for the gap", "int"
    )
    compact_every: int = option(
        16, "compactEvery", "a full state snapshot after this many incremental ones", "int"
    )
    flush_held: bool = option(
        False,
        "flushHeld",
        "decide held records (`OUT_OF_ORDER`) at the end of every batch instead of carrying them",
        "bool",
    )
    #: Kafka 4.x refuses CreateTime more than 1 h ahead (``log.message.timestamp.after.max.ms``).
    grace_ms: int = option(
        3_600_000,
        "timestampSkew",
        "extra life of every producer entry: how far ahead of real time a record timestamp may "
        "be (Kafka 4.x default `log.message.timestamp.after.max.ms`), so no accepted record "
        "expires a live lease; raise it if the topic allows more",
        "ms",
        shown="`1h`",
    )
    lease_public_keys: tuple[str, ...] = option(
        (),
        "leasePublicKey",
        "PEM public key file(s) of the lease servers, comma-separated (key rotation: list the "
        "new key before the servers switch); when set, a record that would create an entry or "
        "move a generation needs a valid, unexpired `pfc` certificate, else it is `FORGED`",
        "paths",
        shown="unset",
    )
    resolve_gaps: bool = option(
        True,
        "resolveGaps",
        "when a producer's reorder window overflows, report the missing seqs as a gap and "
        "continue after them; `false` keeps the proposal's `OUT_OF_ORDER` for every later record",
        "bool",
    )
    record_mac_secret: str | None = option(
        None,
        "recordMacSecret",
        "the lease servers' `--record-mac-secret` file: every idempotent record must then carry "
        "a valid per-record MAC (`pfm`), else it is `FORGED` (reason `mac`)",
        shown="unset",
    )
    lease_servers: str | None = option(
        None,
        "leaseServer",
        "the lease servers `HOST:PORT[,...]`: where the sink could not see producers start it "
        "adopts only those they confirm current and live (docs/gaps.md); unset, it adopts none "
        "(`UNKNOWN_PID`)",
        "servers",
        shown="unset",
    )
    lease_token_file: str | None = option(
        None,
        "leaseTokenFile",
        "the lease servers' auth token file (every executor reads it); unset: "
        "`PIDFENCE_LEASE_TOKEN_FILE`, as producers read it",
        shown="unset",
    )
    lease_tls_ca: str | None = option(
        None, "leaseTlsCa", "CA file to verify the lease servers' TLS", shown="unset"
    )
    lease_tls_cert: str | None = option(
        None, "leaseTlsCert", "client certificate file for the lease servers' TLS", shown="unset"
    )
    lease_tls_key: str | None = option(
        None, "leaseTlsKey", "client key file for the lease servers' TLS", shown="unset"
    )
    starting_offsets: str | None = option(
        None,
        "startingOffsets",
        "where the Kafka source starts a new checkpoint, as it was told (`earliest`, `latest` or "
        "offsets JSON); unset, a new checkpoint whose first batch starts above a partition's "
        "offset 0 fails naming the records it would skip (Spark's Kafka source defaults to "
        "`latest`)",
        shown="unset",
    )
    #: Spark's checkpoint location (its ``checkpointLocation``), where the first batch's start is.
    checkpoint: str | None = None

    claim_lapse_ms: int = option(
        30_000,
        "claimLapse",
        "how long an owner's claim on the output may go unrenewed before a standby instance "
        "takes the output over (the owner renews it every sixth of this)",
        "ms",
        1000,
        "`30s`",
    )
    retain_batches: int = option(
        100,
        "retainBatches",
        "how many recent batches keep their own files under `_pidfence/` (Spark's "
        "`spark.sql.streaming.minBatchesToRetain`: all a re-run can need); older ones are folded "
        "into a few segments, so the sink's files stay flat however long it runs",
        "int",
        1,
    )
    epoch: int = option(
        0,
        "epoch",
        "set by `start_sink`: the epoch of this instance's claim on the output; every commit "
        "checks that no newer epoch claimed it (`0`: a query started without a claim, unfenced)",
        "int",
    )

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
        values = {
            f.name: _read(f.metadata, raw)
            for f in fields(cls)
            if f.metadata and (raw := opts.get(f.metadata["name"].lower())) is not None
        }
        rejects = rejects_path_of(path, opts.get("rejectspath"))
        for name, where in (("path", path), ("rejectsPath", rejects)):
            _check_store(name, where)
        checkpoint = opts.get("checkpointlocation")
        return cls(path=path, rejects_path=rejects, checkpoint=checkpoint, **values)

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


def options_table() -> str:
    """The options table of ``docs/sink.md``, made from the declarations."""
    rows = [
        "| option | default | meaning |",
        "|---|---|---|",
        "| `path` | required | root of the output log: a local path or an `s3://` (`s3a://`) URI |",
        "| `rejectsPath` | `<path>/_rejects` | root of the rejects log |",
    ]
    for f in fields(SinkOptions):
        if f.metadata:
            default = f.metadata["shown"] or f"`{str(f.default).lower()}`"
            rows.append(f"| `{f.metadata['name']}` | {default} | {f.metadata['help']} |")
    return "\n".join(rows)
