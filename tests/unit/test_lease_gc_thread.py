"""Garbage collection runs on a thread of its own: a long pass (the review measured 20,000
lineage records, one ZooKeeper read each) never holds up block claims, so leases keep coming.
Before, the pass ran on the one block-claim thread and every lease that needed a claim waited
for it, then answered UNAVAILABLE. And a pass sends its reads in batches, not one round trip
per record."""

from __future__ import annotations

import threading
from typing import Any

from pidfence.pid_allocator import LeaseClient, LeaseServerThread, MemoryCoordinator, ZkCoordinator
from pidfence.pid_allocator.coordinator import LineageRecord
from tests.unit.lease_kit import FakeKazoo


class SlowCollector(MemoryCoordinator):
    """A store whose garbage collection pass lasts until the test ends it."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting = threading.Event()
        self.finish = threading.Event()

    def collect_garbage(self, now_ms: int, retention_ms: int) -> int:
        self.collecting.set()
        self.finish.wait(30)
        return super().collect_garbage(now_ms, retention_ms)


def test_block_claims_go_on_while_a_collection_pass_runs() -> None:
    store = SlowCollector()
    server = LeaseServerThread(
        None,
        coordinator=store,
        block_size=1,
        max_claim_blocks=1,  # one pid per claim: every lease needs one
        gc_interval_s=0.05,
        claim_timeout_s=3.0,
    ).start()
    try:
        assert store.collecting.wait(10), "no collection pass started"
        claims_before = store.writes
        with LeaseClient(server.address, retries=0, request_timeout_s=10) as client:
            pids = [client.lease().pid for _ in range(5)]
        assert not store.finish.is_set() and store.collecting.is_set()  # still collecting
        assert store.writes >= claims_before + 5  # each lease's block claimed meanwhile
        assert len(set(pids)) == 5
    finally:
        store.finish.set()
        server.stop()


class Pipelined(FakeKazoo):
    """The fake ZooKeeper, recording when a read is sent and when its answer is waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def get_async(self, path: str) -> Any:
        self.events.append("send")
        answer = super().get_async(path)
        events = self.events

        class Waited:
            def get(self, timeout: float | None = None) -> Any:
                events.append("wait")
                return answer.get(timeout)

        return Waited()


def test_a_collection_pass_sends_its_reads_in_batches() -> None:
    fake = Pipelined()
    store = ZkCoordinator("fake:2181", client=fake, op_timeout_s=0.1).start()
    live = LineageRecord(3, 10**12, "t", 1).encode()
    for pid in range(1, 301):
        fake.nodes[f"/pidfence/generations/{pid}"] = (live, 0)
    assert store.collect_garbage(0, 1000) == 0  # all live: nothing deleted
    assert fake.events == ["send"] * 256 + ["wait"] * 256 + ["send"] * 44 + ["wait"] * 44
