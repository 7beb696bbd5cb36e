"""What the lease latency tail is made of, as the server counts it: leases that waited for a block
claim, and garbage-collector pauses (``pidfence bench lease`` reports both per row)."""

from __future__ import annotations

import gc
import threading

from prometheus_client import CollectorRegistry

from pidfence.pid_allocator import LeaseClient, LeaseServerThread, MemoryCoordinator
from pidfence.pid_allocator.coordinator import Block, BlockRequest
from pidfence.pid_allocator.metrics import ServerMetrics


class GatedCoordinator(MemoryCoordinator):
    """Claims wait until ``gate`` is set and report that they started."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()

    def claim_block(self, request: BlockRequest) -> Block:
        self.started.set()
        if not self.gate.wait(10):
            raise TimeoutError("test never opened the gate")
        return super().claim_block(request)


def test_a_lease_that_waits_for_a_claim_is_counted_and_held_pids_are_not() -> None:
    coordinator = GatedCoordinator()
    with (
        LeaseServerThread(None, coordinator=coordinator, block_size=10) as server,
        LeaseClient(server.address, request_timeout_s=10) as client,
    ):
        first: list[int] = []
        waiter = threading.Thread(target=lambda: first.append(client.lease().pid))
        waiter.start()
        assert coordinator.started.wait(10)  # no pid held: the first lease waits for the claim
        coordinator.gate.set()
        waiter.join(10)
        assert first
        # 3 more leave 6 of the block's 10 held, above the reserve: none of them waits.
        pids = [client.lease().pid for _ in range(3)]
        assert pids == [first[0] + 1, first[0] + 2, first[0] + 3]
        assert server.metrics.leases_waited == 1
        assert server.metrics.leases_issued == 4
        get = server.metrics.registry.get_sample_value
        assert get("pidfence_leases_waited_total") == 1


def test_gc_pauses_are_timed_only_while_watched() -> None:
    metrics = ServerMetrics(CollectorRegistry())
    get = metrics.registry.get_sample_value
    metrics.watch_gc()
    metrics.watch_gc()  # idempotent: one hook
    try:
        before = get("pidfence_gc_pause_seconds_count")
        gc.collect()
        # At least the forced collection (the allocator may trigger its own meanwhile).
        assert get("pidfence_gc_pause_seconds_count") >= before + 1
        assert get("pidfence_gc_pause_seconds_sum") > 0
        assert gc.callbacks.count(metrics._on_gc) == 1
    finally:
        metrics.unwatch_gc()
    seen = get("pidfence_gc_pause_seconds_count")
    gc.collect()
    assert get("pidfence_gc_pause_seconds_count") == seen
    assert get("pidfence_gc_pause_seconds_bucket", {"le": "+Inf"}) == seen


def test_the_live_lease_gauge_counts_leases_until_they_end_with_no_request_between() -> None:
    now = [1_000_000]
    with (
        LeaseServerThread(
            None, coordinator=MemoryCoordinator(), clock=lambda: now[0], capacity=8, client_share=1
        ) as server,
        LeaseClient(server.address, request_timeout_s=10) as client,
    ):
        ends = [client.lease().expire_ms for _ in range(3)]
        get = server.metrics.registry.get_sample_value
        assert (get("pidfence_live_leases"), get("pidfence_lease_capacity")) == (3, 8)
        now[0] = max(ends)  # every lease ended; nothing has expired them from the ring yet
        assert len(server.running.service.ring) == 3
        assert get("pidfence_live_leases") == 0
