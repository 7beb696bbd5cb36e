"""``LeaseServerSettings``: every tunable of a lease server, with its one default.

The CLI, ``LeaseServerThread``, the spawner in ``pidfence.services`` and the tests all build
this one type; nothing else holds a default for these values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_LIFETIME_MS = 24 * 3600 * 1000
DEFAULT_BLOCK_TTL_MS = 10 * 60 * 1000


@dataclass(frozen=True, slots=True)
class LeaseServerSettings:
    """Tunables of one lease server (DESIGN.md §5, §5 amended).

    Attributes:
        host: listen address.
        port: listen port (0 = any free port).
        block_size: pids per ZooKeeper claim, at least (one write per claim; a busy server
            claims several blocks' worth in one).
        max_claim_blocks: most blocks' worth of pids one claim takes (1: every claim takes one
            block, e.g. for a baseline of one ZooKeeper write per ``block_size`` pids).
        lifetime_ms: lease lifetime from issue.
        capacity: live leases held in the ring.
        client_share: fraction of ``capacity`` one client (token name, or address without auth)
            may hold.
        block_ttl_ms: a block is issued from only this long after its claim, which bounds the
            expiry of its pids for servers that did not issue them.
        retention_ms: retired and expired pids stay known this long past their lease end
            (None: one lifetime).
        gc_interval_s: how often records past retention are deleted (0: never).
        claim_timeout_s: how long a lease waits for a block claim before UNAVAILABLE.
        max_connections: open connections at most.
        max_connections_per_address: open connections from one client address at most.
        max_in_flight: requests of one connection being answered at once; past it the server
            stops reading that connection (backpressure).
        idle_timeout_s: connections silent this long are closed.
        frame_timeout_s: a started frame must complete within this.
        hello_timeout_s: with auth tokens, a connection must say ``hello`` within this.
        zk_queue: ZooKeeper jobs waiting or running at most; more get RATE_LIMITED.
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
        metrics_port: Prometheus endpoint port (None: off).
        log_format: ``text`` or ``json``.
        ready_file: written with ``HOST:PORT`` once listening.
        event_loop: ``auto`` (uvloop when installed, else asyncio's own), ``asyncio`` or
            ``uvloop`` (``--loop``).
    """

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
    max_connections_per_address: int = 64
    max_in_flight: int = 32
    idle_timeout_s: float = 300.0
    frame_timeout_s: float = 10.0
    hello_timeout_s: float = 10.0
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
    metrics_port: int | None = None
    log_format: str = "text"
    ready_file: Path | None = None
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (
                1 <= self.block_size <= 1_000_000,
                f"block_size must be 1..1000000, got {self.block_size}",
            ),
            (
                1 <= self.max_claim_blocks <= 1024,
                f"max_claim_blocks must be 1..1024, got {self.max_claim_blocks}",
            ),
            (self.lifetime_ms >= 1, f"lifetime_ms must be >= 1, got {self.lifetime_ms}"),
            (self.capacity >= 1, f"capacity must be >= 1, got {self.capacity}"),
            (
                0 < self.client_share <= 1,
                f"client_share must be in (0, 1], got {self.client_share}",
            ),
            (self.block_ttl_ms >= 1, f"block_ttl_ms must be >= 1, got {self.block_ttl_ms}"),
            (
                self.retention_ms is None or self.retention_ms >= 0,
                f"retention_ms must be >= 0, got {self.retention_ms}",
            ),
            (self.max_connections >= 1, "max_connections must be >= 1"),
            (self.max_connections_per_address >= 1, "max_connections_per_address must be >= 1"),
            (self.max_in_flight >= 1, "max_in_flight must be >= 1"),
            (self.zk_queue >= 1, "zk_queue must be >= 1"),
            (0 < self.zk_client_share <= 1, "zk_client_share must be in (0, 1]"),
            (self.zk_workers >= 1, "zk_workers must be >= 1"),
            (0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}"),
            (self.log_format in ("text", "json"), "log_format must be text or json"),
            (
                self.event_loop in ("auto", "asyncio", "uvloop"),
                f"event_loop must be auto, asyncio or uvloop, got {self.event_loop!r}",
            ),
            (
                (self.tls_cert is None) == (self.tls_key is None),
                "give --tls-cert and --tls-key together",
            ),
            (
                self.tls_client_ca is None or self.tls_cert is not None,
                "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def retention(self) -> int:
        """Retention in ms (one lifetime unless set)."""
        return self.lifetime_ms if self.retention_ms is None else self.retention_ms

    @property
    def ring_share(self) -> int:
        """Live leases one client may hold."""
        return max(1, int(self.capacity * self.client_share))

    @property
    def zk_share(self) -> int:
        """ZooKeeper jobs one client may have queued."""
        return max(1, int(self.zk_queue * self.zk_client_share))

    def with_overrides(self, **overrides: Any) -> LeaseServerSettings:
        """A copy with ``overrides``; unknown names raise ``TypeError`` naming the valid ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            valid = ", ".join(sorted(known))
            raise TypeError(f"unknown lease server setting(s) {', '.join(unknown)}; valid: {valid}")
        return replace(self, **overrides)
