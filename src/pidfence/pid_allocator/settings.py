"""``LeaseServerSettings``: every tunable of a lease server, with its one default and its checks.

The CLI, ``LeaseServerThread``, the spawner in ``pidfence.services``, the bench and the tests all
build this one type; nothing else holds a default for these values. How a setting is named on the
command line, in the environment and in a settings file, and how it is read from text, is in
``settings_sources.py``; what may be combined is checked here, once, whatever the source.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pidfence.wire import PidfenceError

DEFAULT_LIFETIME_MS = 24 * 3600 * 1000
DEFAULT_BLOCK_TTL_MS = 10 * 60 * 1000
#: A pid's issue time travels in its secret as milliseconds after its block's claim, in 4 bytes.
MAX_BLOCK_TTL_MS = 2**32 - 1
LOG_FORMATS = ("text", "json")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


class SettingsError(PidfenceError):
    """A lease-server setting is invalid or a combination of settings cannot work (exit 2)."""


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
    """Tunables of one lease server (DESIGN.md §5 and its amendments).

    Attributes:
        zk_hosts: ZooKeeper connect string, optionally with a chroot (``--zk``).
        host: listen address; without ``auth_tokens_file`` only a loopback one unless
            ``insecure``.
        port: listen port (0 = any free port).
        block_size: pids per ZooKeeper claim, at least (a busy server claims several blocks'
            worth in one write).
        max_claim_blocks: most blocks' worth of pids one claim takes.
        lifetime_ms: lease lifetime from issue.
        capacity: live leases held in the ring.
        client_share: fraction of ``capacity`` one client (token name, or address without auth)
            may hold.
        block_ttl_ms: a block is issued from only this long after its claim.
        retention_ms: retired and expired pids stay known this long past their lease end
            (None: one lifetime).
        gc_interval_s: how often records past retention are deleted (0: never).
        claim_timeout_s: how long a lease waits for a block claim before UNAVAILABLE.
        max_connections: admitted connections (past ``hello``, or past accept and TLS without
            auth tokens) at most.
        max_pending_connections: connections still in their TLS handshake or before ``hello`` at
            most (None: ``max_connections``, at most 256): a pool of their own, so they never
            take an admitted client's room; when it is full a new connection evicts one that made
            the least progress, from the address holding the most, oldest first.
        max_connections_per_address: admitted connections from one client address at most.
        max_in_flight: requests of one client (token name, or address without auth) being
            answered at once, over all its connections; past it the client's connections are not
            read (backpressure).
        bump_rate: bumps and rolls per second a client may send beside its other requests
            (RATE_LIMITED past it; a client one request at a time is never refused; 0: no limit).
        bump_burst: bumps and rolls a client may send at once beyond ``bump_rate``.
        lease_rate: leases per second a client may send beside its other requests (as
            ``bump_rate``).
        lease_burst: leases a client may send at once beyond ``lease_rate``.
        idle_timeout_s: connections silent this long are closed.
        frame_timeout_s: a started frame must complete within this.
        hello_timeout_s: a pending connection must finish its TLS handshake and ``hello`` within
            this after accept.
        tls_handshake_timeout_s: a TLS handshake must finish within this after accept.
        max_pre_auth_frame_bytes: largest frame before ``hello`` (a ping or a hello is < 400).
        zk_queue: ZooKeeper jobs waiting or running at most.
        zk_client_share: fraction of ``zk_queue`` one client may fill.
        zk_workers: threads talking to ZooKeeper for requests (block claims have their own).
        zk_root: znode folder of pidfence's state (inside the connect string's chroot).
        zk_session_timeout_s: ZooKeeper session timeout.
        zk_op_timeout_s: longest wait for one ZooKeeper answer.
        zk_auth_file: ``user:password`` for ZooKeeper digest auth; znodes get ACLs for it.
        auth_tokens_file: ``NAME TOKEN`` per line; clients must ``hello`` with one.
        tls_cert: PEM certificate chain to serve TLS with (with ``tls_key``).
        tls_key: PEM private key of ``tls_cert``.
        tls_client_ca: PEM CA bundle; when set, clients must present a certificate it signed.
        signing_key: Ed25519 private key (PEM); every lease, bump and roll carries a ``cert``.
        record_mac_secret: file of the per-record MAC secret (64 hex digits, mode 0600); every
            lease, bump and roll reply carries the lease's ``mac_key``. Needs TLS or ``insecure``.
        insecure: allow what only a trusted network may do: no auth tokens on a non-loopback
            address, ``record_mac_secret`` without TLS.
        metrics_port: Prometheus endpoint port (None: off).
        metrics_host: address of the Prometheus endpoint (loopback unless set).
        audit_interval_s: refusals (failed hellos, owner refusals, rate limits, decode-limit
            closes, evictions) are logged once per peer address, kind and interval.
        log_format: ``text`` or ``json``.
        ready_file: written with ``HOST:PORT`` once listening.
        event_loop: ``auto`` (uvloop when installed, else asyncio's own), ``asyncio`` or
            ``uvloop``.
    """

    zk_hosts: str | None = None
    host: str = "127.0.0.1"
    port: int = 7070
    block_size: int = 100
    max_claim_blocks: int = 16
    lifetime_ms: int = DEFAULT_LIFETIME_MS
    capacity: int = 1_000_000
    client_share: float = 0.25
    block_ttl_ms: int = DEFAULT_BLOCK_TTL_MS
    retention_ms: int | None = None
    gc_interval_s: float = 600.0
    claim_timeout_s: float = 5.0
    max_connections: int = 1024
    max_pending_connections: int | None = None
    max_connections_per_address: int = 64
    max_in_flight: int = 32
    bump_rate: float = 50.0
    bump_burst: int = 200
    lease_rate: float = 2000.0
    lease_burst: int = 2000
    idle_timeout_s: float = 300.0
    frame_timeout_s: float = 10.0
    hello_timeout_s: float = 5.0
    tls_handshake_timeout_s: float = 3.0
    max_pre_auth_frame_bytes: int = 1024
    zk_queue: int = 256
    zk_client_share: float = 0.5
    zk_workers: int = 4
    zk_root: str = "/pidfence"
    zk_session_timeout_s: float = 10.0
    zk_op_timeout_s: float = 5.0
    zk_auth_file: Path | None = None
    auth_tokens_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    signing_key: Path | None = None
    record_mac_secret: Path | None = None
    insecure: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    audit_interval_s: float = 60.0
    log_format: str = "text"
    ready_file: Path | None = None
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        for ok, message in self._checks():
            if not ok:
                raise SettingsError(message)

    def _checks(self) -> list[tuple[bool, str]]:
        positive_ints = (
            "capacity",
            "max_connections",
            "pending_cap",
            "max_connections_per_address",
            "max_in_flight",
            "bump_burst",
            "lease_burst",
            "zk_queue",
            "zk_workers",
            "lifetime_ms",
        )
        positive_times = (
            "idle_timeout_s",
            "frame_timeout_s",
            "hello_timeout_s",
            "tls_handshake_timeout_s",
            "zk_session_timeout_s",
            "zk_op_timeout_s",
            "audit_interval_s",
        )
        checks: list[tuple[bool, str]] = [
            (getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
            for name in positive_ints
        ]
        checks += [
            (getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
            for name in positive_times
        ]
        checks += [
            (
                1 <= self.block_size <= 1_000_000,
                f"block_size must be 1..1000000, got {self.block_size}",
            ),
            (
                1 <= self.max_claim_blocks <= 1024,
                f"max_claim_blocks must be 1..1024, got {self.max_claim_blocks}",
            ),
            (
                0 < self.client_share <= 1,
                f"client_share must be in (0, 1], got {self.client_share}",
            ),
            (
                1 <= self.block_ttl_ms <= MAX_BLOCK_TTL_MS,
                f"block_ttl_ms must be 1..{MAX_BLOCK_TTL_MS} (49 days), got {self.block_ttl_ms}",
            ),
            (
                self.retention_ms is None or self.retention_ms >= 0,
                f"retention_ms must be >= 0, got {self.retention_ms}",
            ),
            (self.gc_interval_s >= 0, f"gc_interval_s must be >= 0, got {self.gc_interval_s}"),
            (
                self.claim_timeout_s >= 0,
                f"claim_timeout_s must be >= 0, got {self.claim_timeout_s}",
            ),
            (
                64 <= self.max_pre_auth_frame_bytes <= 65536,
                f"max_pre_auth_frame_bytes must be 64..65536, got {self.max_pre_auth_frame_bytes}",
            ),
            (0 < self.zk_client_share <= 1, "zk_client_share must be in (0, 1]"),
            (self.bump_rate >= 0, f"bump_rate must be >= 0 (0: no limit), got {self.bump_rate}"),
            (self.lease_rate >= 0, f"lease_rate must be >= 0 (0: no limit), got {self.lease_rate}"),
            (0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}"),
            (
                self.metrics_port is None or 0 <= self.metrics_port <= 65535,
                f"metrics_port must be 0..65535, got {self.metrics_port}",
            ),
            (
                self.log_format in LOG_FORMATS,
                f"log_format must be text or json, got {self.log_format!r}",
            ),
            (
                self.event_loop in EVENT_LOOPS,
                f"event loop (--loop) must be auto, asyncio or uvloop, got {self.event_loop!r}",
            ),
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
        return checks

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
