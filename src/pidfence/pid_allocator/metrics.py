"""Prometheus metrics of one lease server, on its own registry (several servers per process).

The per-lease figures (leases issued, request latency) and the figures the service already
counts (blocks claimed, ZooKeeper writes and errors) are plain numbers read only when Prometheus
scrapes: a prometheus_client ``Counter.inc`` or ``Histogram.observe`` takes a lock and looks up
labels on every call, which cost more than the rest of a lease's bookkeeping. Everything runs on
the server's event loop thread; a scrape (another thread) reads the numbers as they are, and
derives each histogram's count from its buckets so the two always agree.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

#: Request latency buckets (seconds), as ``pidfence_request_seconds`` has always exposed them.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0)
OPS = ("hello", "lease", "bump", "roll", "describe", "ping", "invalid")


class LatencyHistogram:
    """Bucket counts and a sum for one op; ``observe`` is a bisect and two additions."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # last: above the largest bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Record one request that took ``seconds``."""
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds


#: Figures owned by the service, read at scrape time: (blocks claimed, ZooKeeper writes, errors).
ServiceCounts = Callable[[], tuple[int, int, int]]
#: The lease ring, read at scrape time: (live leases, capacity).
RingCounts = Callable[[], tuple[int, int]]
#: Per client, read at scrape time: (label, requests in flight, connections waiting their turn).
ClientQueues = Callable[[], list[tuple[str, int, int]]]
#: The one label of every client named by its address (no token): peers never create labels.
BY_ADDRESS = "(address)"


def client_label(client: str) -> str:
    """The ``client`` label of a client: its token's name, or :data:`BY_ADDRESS`."""
    return client[6:] if client.startswith("token:") else BY_ADDRESS


class ServerMetrics:
    """Counters, gauges and the request latency histogram of one server.

    Hot figures are plain attributes: ``leases_issued`` (int) and ``latency[op]``
    (:class:`LatencyHistogram`); ``service_counts`` is set by the server to read the service's own
    counters, and ``ring_counts`` the lease ring's. The rest are prometheus_client objects (not
    on the lease path).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leases_issued = 0
        #: Leases that found no held pid and waited for a block claim (the slow path).
        self.leases_waited = 0
        self.latency = {op: LatencyHistogram() for op in OPS}
        #: Garbage-collector pauses of the process, once ``watch_gc`` is called.
        self.gc_pauses = LatencyHistogram()
        self._gc_started = 0.0
        self.service_counts: ServiceCounts = lambda: (0, 0, 0)
        self.ring_counts: RingCounts = lambda: (0, 0)
        #: Refusals by kind (``audit.py``): failed hellos, owner refusals, rate limits, ...
        self.audit_events: dict[str, int] = {}
        #: RATE_LIMITED answers by client label (token names: bounded by the tokens file).
        self.client_refusals: dict[str, int] = {}
        self.client_queues: ClientQueues = lambda: []
        self.bumps = Counter("pidfence_bumps", "Generation bumps granted", registry=r)
        self.rolls = Counter(
            "pidfence_rolls", "Rolls granted (pid retired, successor issued)", registry=r
        )
        self.errors = Counter(
            "pidfence_request_errors", "Error replies by code", ["code"], registry=r
        )
        self.connections = Gauge("pidfence_connections", "Admitted client connections", registry=r)
        self.pending = Gauge(
            "pidfence_pending_connections",
            "Connections in their TLS handshake or before hello",
            registry=r,
        )
        self.refused = Counter(
            "pidfence_connections_refused", "Connections refused (limit reached)", registry=r
        )
        self.evicted = Counter(
            "pidfence_connections_evicted",
            "Pending connections closed to make room for a new one",
            registry=r,
        )
        r.register(_HotCollector(self))

    def watch_gc(self) -> None:
        """Time every garbage collection of this process into ``gc_pauses``.

        Process-wide (``gc.callbacks``): called by the dedicated server process only, so that
        in-process servers (tests, the demo) neither count each other's pauses nor leak hooks.
        A collection stops the event loop, and every request in flight waits for it.
        """
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pauses.observe(time.perf_counter() - self._gc_started)


class _HotCollector(Collector):
    """Exposes the plain-number figures of a :class:`ServerMetrics`."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """The figures as they are now."""
        m = self._metrics
        blocks, writes, errors = m.service_counts()
        yield _counter("pidfence_leases", "Leases issued", m.leases_issued)
        yield _counter(
            "pidfence_leases_waited", "Leases that waited for a block claim", m.leases_waited
        )
        yield _counter("pidfence_blocks_claimed", "Pid blocks claimed", blocks)
        yield _counter("pidfence_zookeeper_errors", "ZooKeeper calls failed or timed out", errors)
        yield _counter("pidfence_zookeeper_writes", "ZooKeeper write transactions sent", writes)
        live, capacity = m.ring_counts()
        yield GaugeMetricFamily("pidfence_live_leases", "Live leases in the lease ring", live)
        yield GaugeMetricFamily(
            "pidfence_lease_capacity",
            "Live leases the lease ring holds at most (--capacity)",
            capacity,
        )
        family = HistogramMetricFamily(
            "pidfence_request_seconds", "Request handling latency", labels=["op"]
        )
        bounds = [repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"]
        for op, histogram in m.latency.items():
            family.add_metric([op], _cumulative(bounds, histogram), histogram.sum)
        yield family
        yield _by_label(
            CounterMetricFamily,
            "pidfence_audit_events",
            "Refusals by kind: failed hellos, owner refusals, rate limits, decode-limit closes",
            "event",
            m.audit_events,
        )
        yield _by_label(
            CounterMetricFamily,
            "pidfence_client_refusals",
            "RATE_LIMITED answers by client (token name; all clients without one as one label)",
            "client",
            m.client_refusals,
        )
        flying: dict[str, int] = {}
        ready: dict[str, int] = {}
        for label, in_flight, waiting in m.client_queues():
            flying[label] = flying.get(label, 0) + in_flight
            ready[label] = ready.get(label, 0) + waiting
        yield _by_label(
            GaugeMetricFamily,
            "pidfence_client_in_flight",
            "Requests of a client being answered now (bounded by --max-in-flight)",
            "client",
            flying,
        )
        yield _by_label(
            GaugeMetricFamily,
            "pidfence_client_waiting",
            "Connections of a client holding a request that waits for the client's turn",
            "client",
            ready,
        )
        gc_family = HistogramMetricFamily(
            "pidfence_gc_pause_seconds", "Garbage-collector pauses of the server process"
        )
        gc_family.add_metric([], _cumulative(bounds, m.gc_pauses), m.gc_pauses.sum)
        yield gc_family

    def describe(self) -> Iterator[Metric]:
        """Nothing: collected on every scrape, names checked then."""
        return iter(())


def _cumulative(bounds: list[str], histogram: LatencyHistogram) -> list[tuple[str, float]]:
    counts = list(histogram.counts)  # one snapshot: count == +Inf bucket
    cumulative, running = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        running += count
        cumulative.append((bound, float(running)))
    return cumulative


def _by_label(
    family: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    documentation: str,
    label: str,
    values: Mapping[str, int],
) -> Metric:
    metric = family(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        metric.add_metric([key], float(value))
    return metric


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=float(value))
