"""Prometheus metrics of one lease server, on its own registry (several servers per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServerMetrics:
    """Counters, gauges and the request latency histogram of one server."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leases = Counter("pidfence_leases", "Leases issued", registry=r)
        self.bumps = Counter("pidfence_bumps", "Generation bumps granted", registry=r)
        self.rolls = Counter(
            "pidfence_rolls", "Rolls granted (pid retired, successor issued)", registry=r
        )
        self.blocks = Counter("pidfence_blocks_claimed", "Pid blocks claimed", registry=r)
        self.zk_errors = Counter(
            "pidfence_zookeeper_errors", "ZooKeeper calls failed or timed out", registry=r
        )
        self.zk_writes = Counter(
            "pidfence_zookeeper_writes", "ZooKeeper write transactions sent", registry=r
        )
        self.errors = Counter(
            "pidfence_request_errors", "Error replies by code", ["code"], registry=r
        )
        self.latency = Histogram(
            "pidfence_request_seconds",
            "Request handling latency",
            ["op"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0),
            registry=r,
        )
        self.connections = Gauge("pidfence_connections", "Open client connections", registry=r)
        self.refused = Counter(
            "pidfence_connections_refused", "Connections refused (limit reached)", registry=r
        )
