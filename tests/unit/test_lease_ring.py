"""The lease ring: issue order, expiry from the head, binary search, CAPACITY."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator import LeaseCapacityExhausted, LeaseRing, SettingsError


def test_find_returns_live_leases_and_misses_others() -> None:
    ring = LeaseRing(4)
    ring.append(10, 7, expire_ms=100, now_ms=0)
    ring.append(12, 8, expire_ms=105, now_ms=5)
    found = ring.find(12, now_ms=50)
    assert found is not None
    assert (found.pid, found.generation, found.expire_ms) == (12, 8, 105)
    assert ring.find(11, now_ms=50) is None
    assert ring.find(9, now_ms=50) is None
    assert ring.find(13, now_ms=50) is None


def test_expired_lease_is_not_found_and_leaves_from_head() -> None:
    ring = LeaseRing(4)
    ring.append(1, 0, expire_ms=100, now_ms=0)
    ring.append(2, 0, expire_ms=110, now_ms=10)
    assert ring.find(1, now_ms=100) is None
    assert ring.expire(100) == 1
    assert len(ring) == 1
    assert ring.find(2, now_ms=109) is not None


def test_full_of_live_leases_refuses_and_keeps_every_lease() -> None:
    ring = LeaseRing(2)
    ring.append(1, 0, expire_ms=100, now_ms=0)
    ring.append(2, 0, expire_ms=101, now_ms=1)
    with pytest.raises(LeaseCapacityExhausted, match="capacity"):
        ring.append(3, 0, expire_ms=102, now_ms=2)
    assert ring.find(1, now_ms=2) is not None
    assert ring.find(2, now_ms=2) is not None
    ring.append(3, 0, expire_ms=200, now_ms=100)  # pid 1 expired: its slot is reused
    assert ring.find(3, now_ms=100) is not None


def test_pids_must_increase() -> None:
    ring = LeaseRing(3)
    ring.append(5, 0, expire_ms=100, now_ms=0)
    with pytest.raises(ValueError, match="not above"):
        ring.append(5, 0, expire_ms=100, now_ms=0)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(SettingsError, match="capacity"):
        LeaseRing(0)


@given(
    capacity=st.integers(1, 8),
    steps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 30)), max_size=60),
)
def test_ring_matches_a_plain_model(capacity: int, steps: list[tuple[int, int]]) -> None:
    """Against a list model: same live set, same refusals, across wrap-around."""
    ring = LeaseRing(capacity)
    model: list[tuple[int, int]] = []
    pid, now, lifetime = 0, 0, 20
    for pid_step, time_step in steps:
        pid += pid_step
        now += time_step
        model = [(p, e) for p, e in model if e > now]
        if len(model) == capacity:
            with pytest.raises(LeaseCapacityExhausted):
                ring.append(pid, 1, now + lifetime, now)
        else:
            ring.append(pid, 1, now + lifetime, now)
            model.append((pid, now + lifetime))
        for p in range(max(0, pid - 40), pid + 2):
            live = any(mp == p for mp, _ in model)
            assert (ring.find(p, now) is not None) == live


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 30)), min_size=1, max_size=80),
    st.integers(1, 8),
)
def test_no_client_ever_holds_more_than_its_share(steps: list[tuple[str, int]], share: int) -> None:
    """Per-client counts always equal the live entries of that client, never above the share,
    and a refusal for one client's share never refuses another client with room."""
    ring = LeaseRing(12, share=share)
    now, pid, lifetime = 0, 0, 50
    live: list[tuple[str, int]] = []  # (client, expire)
    for client, advance in steps:
        now += advance
        pid += 1
        live = [(c, e) for c, e in live if e > now]
        try:
            ring.append(pid, 0, now + lifetime, now, client)
        except LeaseCapacityExhausted:
            held = sum(1 for c, _ in live if c == client)
            assert held >= share or len(live) == 12
            continue
        live.append((client, now + lifetime))
        for name in "abc":
            count = sum(1 for c, _ in live if c == name)
            assert ring.held_by(name) == count <= share
        assert len(ring) == len(live)


@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=40),
    st.integers(min_value=0, max_value=2_000),
    st.integers(min_value=1, max_value=8),
)
def test_live_counts_the_leases_not_ended_without_expiring_any(
    gaps: list[int], now_ms: int, expired_first: int
) -> None:
    # A ring wrapped around: some leases expired from the head first, then more appended.
    ring = LeaseRing(len(gaps))
    ends, end = [], 1  # every lease ends after it is issued (at 0)
    for pid, gap in enumerate(gaps, start=1):
        end += gap
        ring.append(pid, 0, expire_ms=end, now_ms=0)
        ends.append(end)
    dropped = ring.expire(ends[min(expired_first, len(ends)) - 1])
    for pid in range(len(gaps) + 1, len(gaps) + 1 + dropped):
        end += 1
        ring.append(pid, 0, expire_ms=end, now_ms=ends[dropped - 1])
        ends.append(end)
    kept = ends[dropped:]
    assert ring.live(now_ms) == sum(1 for e in kept if e > now_ms)
    assert len(ring) == len(kept)  # nothing expired by asking
