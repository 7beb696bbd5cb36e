"""The lease server's event loop choice (``event_loop``: auto, asyncio, uvloop) and the hot-path
helpers that must give the same answers as the plain functions they replace."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerSettings,
    LeaseServerThread,
    MemoryCoordinator,
)
from pidfence.pid_allocator.capability import make_secret, secret_from, secret_hasher
from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.generations import (
    generation_from,
    generation_hasher,
    initial_generation,
)
from pidfence.pid_allocator.loops import LoopUnavailable, loop_factory, resolve_loop
from pidfence.pid_allocator.metrics import LATENCY_BUCKETS, ServerMetrics


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def test_asyncio_is_always_available() -> None:
    factory, name = loop_factory("asyncio")
    loop = factory()
    try:
        assert name == "asyncio"
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_auto_takes_uvloop_exactly_when_installed() -> None:
    assert resolve_loop("auto") == ("uvloop" if _has_uvloop() else "asyncio")


def test_unknown_choice_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="auto, asyncio, uvloop"):
        resolve_loop("trio")
    with pytest.raises(SettingsError, match="--loop"):
        LeaseServerSettings(event_loop="trio")


def test_uvloop_absent_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pidfence.pid_allocator.loops.uvloop_installed", lambda: False)
    assert resolve_loop("auto") == "asyncio"
    with pytest.raises(LoopUnavailable, match=r"pidfence\[fast\]"):
        resolve_loop("uvloop")


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
def test_server_serves_on_each_loop(choice: str) -> None:
    if choice == "uvloop" and not _has_uvloop():
        pytest.skip("uvloop not installed")
    with (
        LeaseServerThread(None, coordinator=MemoryCoordinator(), event_loop=choice) as server,
        LeaseClient(server.address) as client,
    ):
        seen = asyncio.run_coroutine_threadsafe(_loop_module(), server.loop).result(10)
        assert seen.startswith(choice)
        leases = [client.lease() for _ in range(5)]
        assert len({lease.pid for lease in leases}) == 5
        bumped = client.bump(leases[0].pid, leases[0].generation, leases[0].secret)
        assert bumped.generation == leases[0].generation + 1


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@given(
    st.binary(min_size=16, max_size=16),
    st.integers(1, 2**63 - 1),
    st.integers(1, 2**62),
    st.integers(0, 2**32 - 1),
)
def test_keyed_hash_copies_equal_the_plain_functions(
    salt: bytes, pid: int, start: int, offset: int
) -> None:
    assert secret_from(start, secret_hasher(salt), pid, offset) == make_secret(
        start, salt, pid, offset
    )
    assert generation_from(generation_hasher(salt), pid) == initial_generation(salt, pid)


@given(st.lists(st.floats(0, 10, allow_nan=False), max_size=50))
def test_latency_histogram_exposes_cumulative_buckets(samples: list[float]) -> None:
    metrics = ServerMetrics(CollectorRegistry())
    for sample in samples:
        metrics.latency["lease"].observe(sample)
    get = metrics.registry.get_sample_value
    labels = {"op": "lease"}
    assert get("pidfence_request_seconds_count", labels) == len(samples)
    for bound in LATENCY_BUCKETS:
        expected = sum(1 for s in samples if s <= bound)
        assert get("pidfence_request_seconds_bucket", {**labels, "le": str(bound)}) == expected
    assert get("pidfence_request_seconds_bucket", {**labels, "le": "+Inf"}) == len(samples)
