"""Prometheus metrics of one lease server, on its own registry (several servers per process).

The per-lease figures (leases issued, request latency) and the figures the service already
counts (blocks claimed, ZooKeeper writes and errors) are plain numbers read only when Prometheus
scrapes: a prometheus_client ``Counter.inc`` or ``Histogram.observe`` takes a lock and looks up
labels on every call, which cost more than the rest of a lease's bookkeeping. Everything runs on
the server's event loop thread; a scrape (another thread) reads the numbers as they are, and
derives each histogram's count from its buckets so the two always agree.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

#: Request latency buckets (seconds), as ``pidfence_request_seconds`` has always exposed them.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0)
OPS = ("hello", "lease", "bump", "roll", "ping", "invalid")


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


class ServerMetrics:
    """Counters, gauges and the request latency histogram of one server.

    Hot figures are plain attributes: ``leases_issued`` (int) and ``latency[op]``
    (:class:`LatencyHistogram`); ``service_counts`` is set by the server to read the service's own
    counters. The rest are prometheus_client objects (not on the lease path).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leases_issued = 0
        self.latency = {op: LatencyHistogram() for op in OPS}
        self.service_counts: ServiceCounts = lambda: (0, 0, 0)
        self.bumps = Counter("pidfence_bumps", "Generation bumps granted", registry=r)
        self.rolls = Counter(
            "pidfence_rolls", "Rolls granted (pid retired, successor issued)", registry=r
        )
        self.errors = Counter(
            "pidfence_request_errors", "Error replies by code", ["code"], registry=r
        )
        self.connections = Gauge("pidfence_connections", "Open client connections", registry=r)
        self.refused = Counter(
            "pidfence_connections_refused", "Connections refused (limit reached)", registry=r
        )
        r.register(_HotCollector(self))


class _HotCollector(Collector):
    """Exposes the plain-number figures of a :class:`ServerMetrics`."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """The figures as they are now."""
        m = self._metrics
        blocks, writes, errors = m.service_counts()
        yield _counter("pidfence_leases", "Leases issued", m.leases_issued)
        yield _counter("pidfence_blocks_claimed", "Pid blocks claimed", blocks)
        yield _counter("pidfence_zookeeper_errors", "ZooKeeper calls failed or timed out", errors)
        yield _counter("pidfence_zookeeper_writes", "ZooKeeper write transactions sent", writes)
        family = HistogramMetricFamily(
            "pidfence_request_seconds", "Request handling latency", labels=["op"]
        )
        bounds = [repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"]
        for op, histogram in m.latency.items():
            counts = list(histogram.counts)  # one snapshot: count == +Inf bucket
            cumulative, running = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            family.add_metric([op], cumulative, histogram.sum)
        yield family

    def describe(self) -> Iterator[Metric]:
        """Nothing: collected on every scrape, names checked then."""
        return iter(())


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=float(value))
