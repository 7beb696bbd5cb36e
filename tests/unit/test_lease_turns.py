"""Each client's share of the event loop (``fair.py``), decided deterministically on a manual
loop: frames in turns by client, the in-flight bound, rate buckets that refuse only requests sent
beside others, and the mute after a refusal. Against real servers:
``tests/integration/test_hostile_lease_fairness.py``."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import msgpack
import pytest

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerThread,
    MemoryCoordinator,
    RateLimited,
)
from pidfence.pid_allocator.coordinator import LineageRecord
from pidfence.pid_allocator.fair import BUMPS, FRAMES_PER_TURN, LEASES, Bucket, Turns
from pidfence.pid_allocator.metrics import BY_ADDRESS, client_label
from pidfence.pid_allocator.protocol import LENGTH, encode_frame


class ManualLoop:
    """What ``Turns`` uses of an event loop, run by hand: callbacks wait for :meth:`run`."""

    def __init__(self) -> None:
        self.now = 100.0
        self.soon: list[Callable[[], None]] = []
        self.later: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.later.append((self.now + delay, fn, args))

    def run(self) -> None:
        """Run the callbacks due now (one round, as one loop iteration would)."""
        due = [t for t in self.later if t[0] <= self.now]
        self.later = [t for t in self.later if t[0] > self.now]
        soon, self.soon = self.soon, []
        for _, fn, args in due:
            fn(*args)
        for callback in soon:
            callback()


class Connection:
    """A connection with ``frames`` buffered; serving one logs it (and may start a request)."""

    def __init__(self, turns: Turns, client: str, name: str, frames: int, log: list[str]) -> None:
        self.turns = turns
        self.client = client
        self.name = name
        self.frames = deque(range(frames))
        self.log = log
        self.queued = False
        self.closed = False
        self.starts_requests = False
        self.flushed = 0

    def has_frame(self) -> bool:
        return bool(self.frames)

    def serve_one(self) -> None:
        self.frames.popleft()
        self.log.append(self.name)
        if self.starts_requests:
            self.turns.started(self.client)

    def drained(self) -> None:
        pass

    def flush(self) -> None:
        self.flushed += 1

    def arrive(self) -> None:
        if self.frames and not self.queued:
            self.turns.ready(self)


def _turns(max_in_flight: int = 32, bumps: float = 0, burst: int = 1) -> tuple[ManualLoop, Turns]:
    loop = ManualLoop()
    return loop, Turns(loop, max_in_flight, ((bumps, burst), (0, 1)))  # type: ignore[arg-type]


def test_a_flooders_connections_and_depth_buy_it_one_turn_per_round() -> None:
    loop, turns = _turns()
    log: list[str] = []
    flood = [Connection(turns, "token:flood", f"f{i}", 100, log) for i in range(8)]
    victim = Connection(turns, "token:victim", "v", 3, log)
    for c in flood:
        c.arrive()
    assert log == ["f0"]  # nobody waited: answered at once; the rest of it waits in line
    victim.arrive()
    loop.run()
    # One frame per client in turn; the flooder's connections take its turns one after another.
    assert log[:8] == ["f0", "f0", "v", "f1", "v", "f2", "v", "f3"]
    assert len(log) == 1 + FRAMES_PER_TURN  # then the loop polls sockets again
    assert loop.soon  # and the next turn is scheduled
    assert all(c.flushed == 1 for c in (*flood[1:4], victim))  # replies leave once per turn


def test_a_client_at_its_in_flight_bound_waits_while_others_are_served() -> None:
    loop, turns = _turns(max_in_flight=4)
    log: list[str] = []
    flood = [Connection(turns, "token:flood", f"f{i}", 10, log) for i in range(2)]
    for c in flood:
        c.starts_requests = True
        c.arrive()
    loop.run()
    assert log == ["f0", "f0", "f1", "f0"]  # 4 requests in flight: no more of its frames
    assert not loop.soon and all(c.queued for c in flood)  # waiting, unread, in its line
    victim = Connection(turns, "token:victim", "v", 1, log)
    victim.arrive()
    assert log[-1] == "v"  # nobody else in line: answered at once
    turns.finished("token:flood")  # one answered: one more frame of it
    loop.run()
    assert log[-2:] == ["v", "f1"]


def test_only_requests_sent_beside_others_are_charged_and_refused() -> None:
    loop, turns = _turns(bumps=10, burst=2)
    log: list[str] = []
    alone = Connection(turns, "token:alone", "a", 1, log)
    alone.arrive()
    loop.run()
    for _ in range(10):  # one at a time, ten times its burst at once: never refused
        assert turns.charge(alone, BUMPS) == 0.0
    piped = Connection(turns, "token:piped", "p", 5, log)
    piped.arrive()  # more frames buffered behind the one being charged: pipelining
    assert turns.charge(piped, BUMPS) == 0.0
    assert turns.charge(piped, BUMPS) == 0.0
    wait = turns.charge(piped, BUMPS)
    assert wait == pytest.approx(0.1)  # one token at 10/s
    assert turns.charge(piped, LEASES) == 0.0  # leases have no rate here (0: no limit)
    loop.now += 0.1
    assert turns.charge(piped, BUMPS) == 0.0


class ChargedConnection(Connection):
    """A connection whose frames are all bumps, each charged as it is answered (as the server
    charges a request while serving its frame)."""

    def __init__(self, turns: Turns, client: str, name: str, frames: int, log: list[str]) -> None:
        super().__init__(turns, client, name, frames, log)
        self.waits: list[float] = []

    def serve_one(self) -> None:
        super().serve_one()
        self.waits.append(self.turns.charge(self, BUMPS))


def test_frames_pipelined_on_one_connection_are_charged_and_refused() -> None:
    """A client on a single connection, with nothing in flight and nobody else in line, that
    pipelines its frames still sends each beside the ones behind it: they are charged, and past
    its burst one is refused and the rest wait for the mute to end."""
    loop, turns = _turns(bumps=10, burst=2)
    log: list[str] = []
    piped = ChargedConnection(turns, "token:piped", "p", 5, log)
    piped.arrive()
    loop.run()
    loop.run()
    assert piped.waits == [0.0, 0.0, pytest.approx(0.1)]  # two tokens, then one at 10/s
    assert log == ["p", "p", "p"] and piped.queued  # its last two frames wait, unread


def test_a_refused_client_is_not_served_before_its_retry_after() -> None:
    loop, turns = _turns(bumps=10, burst=1)
    log: list[str] = []
    flood = Connection(turns, "token:flood", "f", 10, log)
    flood.arrive()
    assert turns.charge(flood, BUMPS) == 0.0
    assert turns.charge(flood, BUMPS) == pytest.approx(0.1)  # refused: muted for 0.1 s
    loop.run()
    assert log == ["f", "f"]  # answered at arrival, and the turn already scheduled; then waits
    loop.run()
    assert log == ["f", "f"] and flood.queued
    loop.now += 0.1
    loop.run()  # its wake-up
    loop.run()  # its turn
    assert log[:3] == ["f", "f", "f"]


def test_an_idle_client_keeps_its_spent_bucket_and_full_ones_are_forgotten() -> None:
    loop, turns = _turns(bumps=1, burst=5)
    log: list[str] = []
    spent = Connection(turns, "token:spent", "s", 10, log)
    spent.arrive()
    while (wait := turns.charge(spent, BUMPS)) == 0.0:  # pipelined: charged until refused
        pass
    loop.now += wait
    while spent.frames:  # its frames are served, then it goes quiet (not muted any more)
        loop.run()
    for i in range(300):  # clients come and go; the table is swept as it grows
        Connection(turns, f"addr:10.0.{i // 250}.{i % 250}", "x", 1, log).arrive()
        loop.run()
    assert "token:spent" in turns.clients  # going quiet does not refill a flooder's bucket
    assert len(turns.clients) < 300


def test_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = Bucket(rate=4, burst=2, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.25]
    assert bucket.take(0.25) == 0.0
    assert bucket.take(0.25, force=True) == 0.0  # forced: no token taken, never refused
    assert not bucket.full(0.5) and bucket.full(10.0)
    assert bucket.take(10.0) == 0.0 and bucket.take(10.0) == 0.0 and bucket.take(10.0) > 0


def test_clients_without_a_token_share_one_metric_label() -> None:
    assert client_label("token:orders-app") == "orders-app"
    assert client_label("addr:203.0.113.9") == client_label("addr:10.0.0.1") == BY_ADDRESS


class GatedStore(MemoryCoordinator):
    """Lineage reads wait for ``gate``: a bump stays in flight as long as a test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()

    def read_lineage(self, pid: int) -> tuple[LineageRecord, int] | None:
        if not self.gate.is_set():
            self.held.set()
        self.gate.wait(60)
        return super().read_lineage(pid)


def test_a_lease_beside_a_bump_in_flight_is_refused_with_a_retry_after() -> None:
    store = GatedStore()
    with (
        LeaseServerThread(
            None, coordinator=store, block_size=10, lease_rate=2, lease_burst=1
        ) as server,
        LeaseClient(server.address) as busy,
        LeaseClient(server.address, rate_limited_wait_s=0) as other,
    ):
        lease = busy.lease()
        store.gate.clear()  # the same client (one address, no tokens) has a bump in flight
        bumping = threading.Thread(
            target=busy.bump, args=(lease.pid, lease.generation, lease.secret)
        )
        bumping.start()
        assert store.held.wait(10)
        try:
            with pytest.raises(RateLimited, match="--lease-rate") as refused:
                for _ in range(3):  # the bucket holds one token (refilled meanwhile, or not)
                    other.lease()
            assert 1 <= refused.value.retry_after_ms <= 500
        finally:
            store.gate.set()
            bumping.join(10)
        assert other.lease().pid >= 1  # alone again: served (after the mute)


class RateLimitingServer:
    """A fake lease server on one connection: RATE_LIMITED (retry after 250 ms) ``times`` times,
    then a lease."""

    LEASE: ClassVar[dict[str, Any]] = {
        "pid": 7,
        "generation": 1,
        "sequence": 0,
        "expire_ms": 1,
        "secret": b"s",
    }

    def __init__(self, times: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        refusal = {"error": "RATE_LIMITED", "message": "slow down", "retry_after_ms": 250}
        self.replies = [refusal] * times + [{"error": None, **self.LEASE}]
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.accepted.append(conn)
        for reply in self.replies:
            head = conn.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return
            (length,) = LENGTH.unpack(head)
            request = msgpack.unpackb(conn.recv(length, socket.MSG_WAITALL))
            conn.sendall(encode_frame({"v": 1, "id": request["id"], **reply}))

    def close(self) -> None:
        # Shut down before closing: the serving thread may still be in recv(), and a socket
        # closed under it fails there (EBADF); a shut-down one reads end-of-stream.
        for conn in self.accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def test_lease_client_waits_each_retry_after_on_the_same_connection() -> None:
    server = RateLimitingServer(times=3)
    sleeps: list[float] = []
    try:
        with LeaseClient(server.address, retries=0, sleep=sleeps.append, backoff_s=5) as client:
            assert client.lease().pid == 7
    finally:
        server.close()
    assert sleeps == [0.25, 0.25, 0.25]  # the server's wait, not the 5 s backoff
    assert len(server.accepted) == 1  # no failover, no new connection; not counted as retries


def test_lease_client_stops_waiting_past_its_bound() -> None:
    server = RateLimitingServer(times=10)
    sleeps: list[float] = []
    try:
        with (
            LeaseClient(server.address, sleep=sleeps.append, rate_limited_wait_s=0.6) as client,
            pytest.raises(RateLimited, match="slow down") as refused,
        ):
            client.lease()
    finally:
        server.close()
    assert refused.value.retry_after_ms == 250
    assert sleeps == [0.25, 0.25]  # a third wait would pass 0.6 s


def test_a_client_one_request_at_a_time_is_never_refused_however_fast() -> None:
    with (
        LeaseServerThread(
            None, coordinator=MemoryCoordinator(), block_size=10, bump_rate=1, bump_burst=1
        ) as server,
        LeaseClient(server.address, rate_limited_wait_s=0) as client,
    ):
        lease = client.lease()
        for _ in range(200):  # far past its rate and burst, each sent as the last returns
            lease = client.bump(lease.pid, lease.generation, lease.secret)
