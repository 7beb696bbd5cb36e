"""``LeaseServerSettings``: every tunable of a lease server, each declared once.

A setting is one field: its type, its default, and (:func:`setting`) the option that names it,
its help and its bounds. From those declarations come the ``pidfence lease-server`` options, the
``PIDFENCE_LEASE_SERVER_*`` variables and the settings file keys (``settings_sources.py``), the
checks below, and the options table of ``docs/lease-server.md`` (``options_table``; a unit test
keeps the page equal to it). The CLI, ``LeaseServerThread``, the spawner in
``pidfence.services``, the bench and the tests all build this one type.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from pidfence.pid_allocator.declaration import Setting, SettingsError, setting

#: A pid's issue time travels in its secret as milliseconds after its block's claim, in 4 bytes.
MAX_BLOCK_TTL_MS: Final = 2**32 - 1
#: Most pids a server keeps in reserve ahead of its leases, and claims in one write, in blocks.
MAX_RESERVE_BLOCKS: Final = 16
#: How many recent claims the reserve remembers: it follows the slowest of them, because claim
#: times vary several-fold (ZooKeeper's fsync, thread handoffs) and the last one says little.
CLAIM_MEMORY: Final = 8
#: Reserve (and claim size) over the most pids a recent claim's wait consumed: a claim may take
#: several times as long as the recent slowest one on a loaded machine (measured: p99 claim time
#: about 4x the median), and the pids cost nothing but the one write that claims them.
RESERVE_FACTOR: Final = 4
#: ZooKeeper defaults, shared with ``ZkCoordinator`` (built without settings in tests and tools).
ZK_ROOT: Final = "/pidfence"
ZK_SESSION_TIMEOUT_S: Final = 10.0
ZK_OP_TIMEOUT_S: Final = 5.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


@dataclass(frozen=True, slots=True)
class LeaseServerSettings:
    """Tunables of one lease server (DESIGN.md §5 and its amendments): see each field's
    declaration, or ``pidfence lease-server --help``.

    ``host`` and ``port`` are set together by ``--listen``; without ``auth_tokens_file`` the
    server listens on a loopback address only, unless ``insecure``.
    """

    zk_hosts: str | None = setting(
        None,
        "zk",
        "ZooKeeper connect string (required); a chroot suffix (`/kafka-apps`) scopes all state",
        unset="(required)",
    )
    host: str = setting(
        "127.0.0.1",
        "listen",
        "address to serve: HOST:PORT (`:PORT` on 127.0.0.1; port 0, as in `:0`, picks a free "
        "port, logged and written to `--ready-file`); not loopback: needs `--auth-tokens` or "
        "`--insecure`",
        kind="listen",
    )
    port: int = field(default=7070)
    auth_tokens_file: Path | None = setting(
        None,
        "auth-tokens",
        "file of `NAME TOKEN` lines (mode 0600); clients must `hello` first",
        kind="path",
    )
    tls_cert: Path | None = setting(
        None, "tls-cert", "PEM certificate chain: serve TLS", kind="path"
    )
    tls_key: Path | None = setting(None, "tls-key", "PEM private key of `--tls-cert`", kind="path")
    tls_client_ca: Path | None = setting(
        None,
        "tls-client-ca",
        "mutual TLS: clients must present a certificate this CA (PEM) signed",
        kind="path",
    )
    zk_auth_file: Path | None = setting(
        None,
        "zk-auth-file",
        "`USER:PASSWORD` (mode 0600): ZooKeeper digest auth; every znode gets an ACL for it alone",
        kind="path",
    )
    signing_key: Path | None = setting(
        None,
        "signing-key",
        "Ed25519 PEM key: every lease, bump and roll reply carries `cert`",
        kind="path",
    )
    record_mac_secret: Path | None = setting(
        None,
        "record-mac-secret",
        "file of 64 hex digits (mode 0600): every lease, bump and roll reply carries the lease's "
        "`mac_key`; needs TLS or `--insecure`",
        kind="path",
    )
    insecure: bool = setting(
        False,
        "insecure",
        "the network is trusted: allow no tokens off loopback, and MAC keys in clear",
        kind="flag",
    )
    lifetime_ms: int = setting(
        24 * 3600 * 1000, "lifetime", "lease lifetime from issue", kind="ms", low=1
    )
    block_size: int = setting(
        100,
        "block-size",
        "pids claimed per ZooKeeper write, at least (a busy server claims several blocks' worth "
        "in one write)",
        kind="int",
        low=1,
        high=1_000_000,
    )
    max_claim_blocks: int = setting(
        MAX_RESERVE_BLOCKS,
        "max-claim-blocks",
        f"most blocks one claim takes ({RESERVE_FACTOR}x what the busiest of the last "
        f"{CLAIM_MEMORY} claims used); 1 claims exactly one block per write; at most "
        f"{MAX_RESERVE_BLOCKS}, the reserve's cap",
        kind="int",
        low=1,
        high=MAX_RESERVE_BLOCKS,
    )
    block_ttl_ms: int = setting(
        10 * 60 * 1000,
        "block-ttl",
        "a claimed block is issued from only this long (at most 49 days: the issue offset travels "
        "in 4 bytes)",
        kind="ms",
        low=1,
        high=MAX_BLOCK_TTL_MS,
    )
    retention_ms: int | None = setting(
        None,
        "retention",
        "retired and expired pids stay known this long past their lease end"
        ' (see "A pid\'s lineage outlives every request about it")',
        kind="ms",
        low=0,
        unset="the lifetime",
    )
    gc_interval_s: float = setting(
        600.0,
        "gc-interval",
        "forgotten block and lineage records are deleted this often (`0`: never)",
        kind="seconds",
        low=0,
    )
    claim_timeout_s: float = setting(
        5.0,
        "claim-timeout",
        "a lease waits this long for a block claim, then `UNAVAILABLE`",
        kind="seconds",
        low=0,
    )
    capacity: int = setting(
        1_000_000,
        "capacity",
        "live leases one server holds (the lease ring); full ring answers `CAPACITY`",
        kind="int",
        low=1,
    )
    client_share: float = setting(
        0.25,
        "client-share",
        "fraction of the ring one client (token name, or address without auth) may hold",
        kind="float",
        above=0,
        high=1,
    )
    max_connections: int = setting(
        1024,
        "max-connections",
        "admitted connections (past `hello`; without tokens, past accept and TLS); more get "
        "`UNAVAILABLE`",
        kind="int",
        low=1,
    )
    max_pending_connections: int | None = setting(
        None,
        "max-pending-connections",
        "connections in their TLS handshake or before `hello`: a pool of their own (see "
        '"Hostile peers")',
        kind="int",
        low=1,
        unset="`--max-connections`, at most 256",
    )
    max_connections_per_address: int = setting(
        64,
        "max-connections-per-address",
        "admitted connections from one client address",
        kind="int",
        low=1,
    )
    max_connections_per_client: int | None = setting(
        None,
        "max-connections-per-client",
        "admitted connections of one client (its token's name, at `hello`), from any address",
        kind="int",
        low=1,
        unset="`--max-connections` / 4",
    )
    max_in_flight: int = setting(
        32,
        "max-in-flight",
        "requests of one client (token name, or address without auth) answered at once over all "
        "its connections; past it its connections are not read (backpressure)",
        kind="int",
        low=1,
    )
    bump_rate: float = setting(
        50.0,
        "bump-rate",
        "bumps and rolls per second a client may send beside its other requests (`RATE_LIMITED` "
        "past it; a client one request at a time is never refused; `0`: no limit)",
        kind="float",
        low=0,
    )
    bump_burst: int = setting(
        200,
        "bump-burst",
        "bumps and rolls a client may send at once past `--bump-rate`",
        kind="int",
        low=1,
    )
    lease_rate: float = setting(
        2000.0,
        "lease-rate",
        "leases and describes per second a client may send beside its other requests (as "
        "`--bump-rate`)",
        kind="float",
        low=0,
    )
    lease_burst: int = setting(
        2000,
        "lease-burst",
        "leases and describes a client may send at once past `--lease-rate`",
        kind="int",
        low=1,
    )
    idle_timeout_s: float = setting(
        300.0, "idle-timeout", "connections silent this long are closed", kind="seconds", above=0
    )
    frame_timeout_s: float = setting(
        10.0, "frame-timeout", "a started frame must complete within this", kind="seconds", above=0
    )
    hello_timeout_s: float = setting(
        5.0,
        "hello-timeout",
        "a pending connection must finish TLS and `hello` within this after accept",
        kind="seconds",
        above=0,
    )
    tls_handshake_timeout_s: float = setting(
        3.0,
        "tls-handshake-timeout",
        "a TLS handshake must finish within this",
        kind="seconds",
        above=0,
    )
    max_pre_auth_frame_bytes: int = setting(
        1024,
        "max-pre-auth-frame",
        "largest frame (bytes) before `hello` (a ping or hello is under 400)",
        kind="int",
        low=64,
        high=65536,
    )
    zk_queue: int = setting(
        256,
        "zk-queue",
        'ZooKeeper jobs queued or running at most (see "Nobody slows anybody")',
        kind="int",
        low=1,
    )
    zk_client_share: float = setting(
        0.5,
        "zk-client-share",
        "fraction of `--zk-queue` one client may hold",
        kind="float",
        above=0,
        high=1,
    )
    zk_workers: int = setting(
        4,
        "zk-workers",
        "threads serving bumps and rolls (block claims have their own), plus one kept for clients "
        "with nothing running",
        kind="int",
        low=1,
    )
    zk_root: str = setting(
        ZK_ROOT, "zk-root", "znode folder of pidfence's state, inside the chroot"
    )
    zk_session_timeout_s: float = setting(
        ZK_SESSION_TIMEOUT_S,
        "zk-session-timeout",
        "ZooKeeper session timeout",
        kind="seconds",
        above=0,
    )
    zk_op_timeout_s: float = setting(
        ZK_OP_TIMEOUT_S,
        "zk-op-timeout",
        "longest wait for one ZooKeeper answer",
        kind="seconds",
        above=0,
    )
    metrics_port: int | None = setting(
        None, "metrics-port", "Prometheus endpoint (`/metrics`) port", kind="int", low=0, high=65535
    )
    metrics_host: str = setting(
        "127.0.0.1",
        "metrics-host",
        "address of the metrics endpoint: loopback unless told otherwise",
    )
    audit_interval_s: float = setting(
        60.0,
        "audit-interval",
        "refusals are logged once per peer address, kind and interval",
        kind="seconds",
        above=0,
    )
    log_format: str = setting(
        "text",
        "log-format",
        "`json` gives one JSON object per line",
        choices=("text", "json"),
    )
    event_loop: str = setting(
        "auto",
        "loop",
        "event loop: `auto` picks uvloop when installed (`pip install pidfence[fast]`), else "
        "asyncio; `uvloop` without it exits 2",
        choices=("auto", "asyncio", "uvloop"),
    )
    ready_file: Path | None = setting(
        None, "ready-file", "written atomically with `HOST:PORT` once listening", kind="path"
    )

    def __post_init__(self) -> None:
        problems = [s.problem(getattr(self, s.field)) for s in declared()]
        problems.append(
            None if 0 <= self.port <= 65535 else f"port must be 0..65535, got {self.port}"
        )
        problems.append(_zk_problem(self.zk_hosts))
        for ok, message in self._together():
            problems.append(None if ok else message)
        first = next((p for p in problems if p is not None), None)
        if first is not None:
            raise SettingsError(first)

    def _together(self) -> list[tuple[bool, str]]:
        """The settings that only work together."""
        return [
            (
                (self.tls_cert is None) == (self.tls_key is None),
                "give --tls-cert and --tls-key together",
            ),
            (
                self.tls_client_ca is None or self.tls_cert is not None,
                "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)",
            ),
            (
                self.auth_tokens_file is not None or is_loopback(self.host) or self.insecure,
                f"without --auth-tokens the server trusts whoever reaches it, so it listens on "
                f"loopback only; {self.host} is not: give --auth-tokens FILE, or pass --insecure "
                "on a network where every host is trusted",
            ),
            (
                self.record_mac_secret is None or self.tls_cert is not None or self.insecure,
                "--record-mac-secret sends each lease's MAC key in its reply: serve TLS "
                "(--tls-cert, --tls-key), or pass --insecure on a trusted network",
            ),
        ]

    @property
    def retention(self) -> int:
        """Retention in ms (one lifetime unless set)."""
        return self.lifetime_ms if self.retention_ms is None else self.retention_ms

    @property
    def pending_cap(self) -> int:
        """Pending connections at most."""
        if self.max_pending_connections is not None:
            return self.max_pending_connections
        return min(256, self.max_connections)

    @property
    def client_connection_cap(self) -> int:
        """Admitted connections one client (token name) may hold."""
        if self.max_connections_per_client is not None:
            return self.max_connections_per_client
        return max(1, self.max_connections // 4)

    @property
    def ring_share(self) -> int:
        """Live leases one client may hold."""
        return max(1, int(self.capacity * self.client_share))

    @property
    def zk_share(self) -> int:
        """ZooKeeper jobs one client may have queued or running."""
        return max(1, int(self.zk_queue * self.zk_client_share))

    @property
    def tls(self) -> bool:
        """Whether the server serves TLS."""
        return self.tls_cert is not None

    @property
    def auth(self) -> bool:
        """Whether clients must ``hello`` with a token."""
        return self.auth_tokens_file is not None

    def with_overrides(self, **overrides: Any) -> LeaseServerSettings:
        """A copy with ``overrides``, checked again.

        Raises:
            SettingsError: an unknown name (the message lists the valid ones), or a bad value.
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            valid = ", ".join(sorted(known))
            raise SettingsError(
                f"unknown lease server setting(s) {', '.join(unknown)}; valid: {valid}"
            )
        return replace(self, **overrides)


def declared() -> tuple[Setting, ...]:
    """Every declared setting, in ``--help`` order (each knows its field)."""
    return tuple(
        replace(f.metadata["setting"], field=f.name)
        for f in fields(LeaseServerSettings)
        if "setting" in f.metadata
    )


def _zk_problem(hosts: str | None) -> str | None:
    """What is wrong with a ZooKeeper connect string, as kazoo would find it at start."""
    if hosts is None:
        return None
    from kazoo.hosts import collect_hosts

    try:
        collect_hosts(hosts)
    except ValueError as exc:
        return f"--zk {hosts!r} is not HOST:PORT[,HOST:PORT...][/chroot]: {exc}"
    return None
