"""Every row of the DESIGN §4 table, capacity, expiry order, held-record fencing and flush."""

from __future__ import annotations

import numpy as np
import pytest

from pidfence.broker_plugin import CorruptSnapshot, ProducerStateTable, rebuild
from pidfence.broker_plugin.ring import EntryRing
from pidfence.wire import FLAG_FENCE, Verdict, encode_pf

V = Verdict


def verdicts(decisions: list) -> list[tuple[object, Verdict]]:
    return [(d.ref, d.verdict) for d in decisions]


def one(
    table: ProducerStateTable, pid: int, g: int, s: int, ts: int = 0, flags: int = 0
) -> Verdict:
    (decision,) = table.offer(pid, g, s, ts, flags, ref="r")
    return decision.verdict


@pytest.fixture
def table() -> ProducerStateTable:
    return ProducerStateTable(capacity=3, lifetime_ms=1000, reorder_window=2)


def test_pid_zero_and_missing_header_are_not_idempotent(table: ProducerStateTable) -> None:
    assert one(table, 0, 5, 7) is V.NON_IDEMPOTENT
    assert table.offer_header(None, 0)[0].verdict is V.NON_IDEMPOTENT
    assert len(table) == 0


def test_undecodable_header_is_malformed(table: ProducerStateTable) -> None:
    assert table.offer_header(b"\x95\x01", 0)[0].verdict is V.MALFORMED
    assert table.offer(1, -1, 0, 0)[0].verdict is V.MALFORMED
    assert len(table) == 0


def test_capacity_never_evicts_live_state(table: ProducerStateTable) -> None:
    for pid in (1, 2, 3):
        assert one(table, pid, 0, 0) is V.APPENDED
    assert one(table, 4, 0, 0) is V.CAPACITY
    assert table.offer(4, 0, 0, 0, FLAG_FENCE)[0].verdict is V.CAPACITY
    assert table.get(4) is None
    assert [table.get(p) for p in (1, 2, 3)] == [(0, 0, 0)] * 3
    # Known producers still get their records in.
    assert one(table, 2, 0, 1) is V.APPENDED


def test_fence_creates_entry_at_seq_minus_one(table: ProducerStateTable) -> None:
    assert one(table, 9, 4, 10, ts=5, flags=FLAG_FENCE) is V.FENCE
    assert table.get(9) == (4, 9, 5)
    assert one(table, 9, 4, 10) is V.APPENDED


def test_new_producer_at_seq_zero_is_appended(table: ProducerStateTable) -> None:
    assert one(table, 7, 3, 0, ts=42) is V.APPENDED
    assert table.get(7) == (3, 0, 42)


def test_unknown_pid_mid_stream(table: ProducerStateTable) -> None:
    assert one(table, 7, 3, 5) is V.UNKNOWN_PID
    assert table.get(7) is None


def test_older_generation_is_fenced(table: ProducerStateTable) -> None:
    one(table, 1, 5, 0)
    assert one(table, 1, 4, 1) is V.FENCED
    assert table.get(1) == (5, 0, 0)


def test_generation_jump_of_two_is_invalid(table: ProducerStateTable) -> None:
    one(table, 1, 5, 0)
    assert one(table, 1, 7, 1) is V.INVALID_GENERATION
    assert table.get(1) == (5, 0, 0)


def test_fence_with_entry_moves_generation_only(table: ProducerStateTable) -> None:
    one(table, 1, 5, 0)
    one(table, 1, 5, 1)
    assert one(table, 1, 6, 2, flags=FLAG_FENCE) is V.FENCE
    assert table.get(1) == (6, 1, 0)
    assert one(table, 1, 5, 2) is V.FENCED  # the zombie, after the fence
    assert one(table, 1, 6, 2) is V.APPENDED


def test_duplicate_changes_nothing_even_under_the_next_generation(
    table: ProducerStateTable,
) -> None:
    one(table, 1, 5, 0)
    one(table, 1, 5, 1, ts=10)
    before = table.state()
    assert one(table, 1, 5, 1, ts=20) is V.DUPLICATE
    assert one(table, 1, 6, 0, ts=30) is V.DUPLICATE
    assert table.state() == before  # not gE, not the clock (DESIGN §4 amended)
    assert one(table, 1, 5, 2) is V.APPENDED  # generation 5 was never fenced


def test_next_sequence_is_appended_and_releases_held(table: ProducerStateTable) -> None:
    one(table, 1, 0, 0)
    assert table.offer(1, 0, 3, 0, ref="s3")[0].verdict is V.BUFFERED
    assert table.offer(1, 0, 2, 0, ref="s2")[0].verdict is V.BUFFERED
    assert verdicts(table.offer(1, 0, 1, 0, ref="s1")) == [
        ("s1", V.APPENDED),
        ("s2", V.APPENDED),
        ("s3", V.APPENDED),
    ]
    assert table.get(1) == (0, 3, 0)
    assert table.held_count == 0


def test_gap_beyond_window_is_out_of_order(table: ProducerStateTable) -> None:
    one(table, 1, 0, 0)
    assert one(table, 1, 0, 4) is V.OUT_OF_ORDER  # window 2 allows up to seq 3
    assert table.held_count == 0


def test_same_held_record_twice_is_a_duplicate(table: ProducerStateTable) -> None:
    one(table, 1, 0, 0)
    assert one(table, 1, 0, 2) is V.BUFFERED
    assert one(table, 1, 0, 2) is V.DUPLICATE
    assert table.held_count == 1


def test_held_record_is_fenced_by_a_bump_while_it_waits(table: ProducerStateTable) -> None:
    one(table, 1, 0, 0)
    assert table.offer(1, 0, 2, 0, ref="zombie")[0].verdict is V.BUFFERED
    assert verdicts(table.offer(1, 1, 1, 0, ref="new")) == [
        ("new", V.APPENDED),
        ("zombie", V.FENCED),
    ]
    assert table.get(1) == (1, 1, 0)


def test_flush_closes_the_window(table: ProducerStateTable) -> None:
    one(table, 1, 0, 0)
    table.offer(1, 0, 2, 0, ref="a")
    table.offer(1, 0, 3, 0, ref="b")
    assert verdicts(table.flush(0)) == [("a", V.OUT_OF_ORDER), ("b", V.OUT_OF_ORDER)]
    assert table.held_count == 0
    assert table.get(1) == (0, 0, 0)


def test_entries_expire_in_creation_order_from_the_ring() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=100, grace_ms=10)
    one(table, 1, 0, 0, ts=0)
    one(table, 2, 0, 0, ts=50)
    assert one(table, 3, 0, 0, ts=60) is V.CAPACITY
    assert one(table, 1, 0, 1, ts=109) is V.APPENDED  # 0 + 100 + 10 > 109
    assert one(table, 3, 0, 0, ts=110) is V.APPENDED  # pid 1 expired, its slot is free
    assert table.get(1) is None
    # The table is full again, and CAPACITY comes before UNKNOWN_PID in §4's order.
    assert one(table, 1, 0, 2, ts=111) is V.CAPACITY
    assert [pid for pid, _ in table.ring] == [2, 3]
    # Judged at ts 160 pid 2 has expired (50 + 110), so there is room and the pid is unknown;
    # a rejected record moves nothing, so pid 2 leaves the ring only with a record that lands.
    assert one(table, 1, 0, 2, ts=160) is V.UNKNOWN_PID
    assert [pid for pid, _ in table.ring] == [2, 3]
    assert one(table, 0, 0, 0, ts=160) is V.NON_IDEMPOTENT
    assert [pid for pid, _ in table.ring] == [3]


def test_clock_never_goes_back() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=100)
    one(table, 1, 0, 0, ts=500)
    one(table, 2, 0, 0, ts=400)  # late timestamp: created at the clock, 500
    assert table.get(2) == (0, 0, 500)
    assert table.clock == 500


def test_expiry_drops_held_records_as_out_of_order() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=100)
    one(table, 1, 0, 0, ts=0)
    table.offer(1, 0, 2, 0, ref="held")
    assert verdicts(table.offer(2, 0, 0, 100, ref="x")) == [
        ("x", V.APPENDED),
        ("held", V.OUT_OF_ORDER),
    ]


def test_zero_window_holds_nothing() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=100, reorder_window=0)
    one(table, 1, 0, 0)
    assert one(table, 1, 0, 2) is V.OUT_OF_ORDER


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity": 0, "lifetime_ms": 1},
        {"capacity": 1, "lifetime_ms": 0},
        {"capacity": 1, "lifetime_ms": 1, "reorder_window": -1},
        {"capacity": 1.5, "lifetime_ms": 1},
    ],
)
def test_impossible_configuration_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        ProducerStateTable(**kwargs)


def test_ring_is_fixed_size_and_fifo() -> None:
    ring = EntryRing(2)
    ring.append(1, 0)
    ring.append(2, 1)
    assert ring.full
    with pytest.raises(OverflowError):
        ring.append(3, 2)
    assert ring.pop() == (1, 0)
    ring.append(3, 2)
    assert list(ring) == [(2, 1), (3, 2)]


def test_offer_header_matches_offer() -> None:
    a = ProducerStateTable(4, 1000)
    b = ProducerStateTable(4, 1000)
    for pid, g, s, f in [(1, 0, 0, 0), (1, 0, 1, 0), (1, 1, 2, FLAG_FENCE), (1, 0, 2, 0)]:
        assert (
            a.offer(pid, g, s, 0, f)[0].verdict
            is b.offer_header(encode_pf(pid, g, s, f), 0)[0].verdict
        )
    assert a == b


def test_successor_resend_replaces_a_zombies_held_copy() -> None:
    # Old generation 0 sent s=2 before s=1 and died; generation 1 re-sends 2 then 1. Calling the
    # resend a DUPLICATE of the waiting zombie copy (fenced at release) would lose seq 2.
    table = ProducerStateTable(capacity=2, lifetime_ms=1000, reorder_window=3)
    one(table, 1, 0, 0)
    assert table.offer(1, 0, 2, 0, ref="zombie s2")[0].verdict is V.BUFFERED
    assert verdicts(table.offer(1, 1, 2, 0, ref="resend s2")) == [
        ("zombie s2", V.FENCED),
        ("resend s2", V.BUFFERED),
    ]
    assert table.get(1) == (0, 0, 0)  # held, not appended: gE moves at release
    assert verdicts(table.offer(1, 1, 1, 0, ref="s1")) == [
        ("s1", V.APPENDED),
        ("resend s2", V.APPENDED),
    ]
    assert table.get(1) == (1, 2, 0)


def test_held_copy_of_an_older_generation_is_replaced_after_a_bump() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=1000, reorder_window=3)
    one(table, 1, 0, 0)
    table.offer(1, 0, 3, 0, ref="zombie s3")
    table.offer(1, 1, 0, 0, ref="resend s0")  # DUPLICATE: changes nothing
    assert verdicts(table.offer(1, 1, 3, 0, ref="resend s3")) == [
        ("zombie s3", V.FENCED),
        ("resend s3", V.BUFFERED),
    ]


def test_ring_wraps_around_many_times() -> None:
    table = ProducerStateTable(capacity=3, lifetime_ms=10)
    for i in range(50):
        # One new producer per 5 ms lives 10 ms: at most 2 live at once, slots reused forever.
        assert one(table, i + 1, 0, 0, ts=i * 5) is V.APPENDED
        assert len(table) == min(i + 1, 2)
    assert [pid for pid, _ in table.ring] == [49, 50]
    assert one(table, 48, 0, 1, ts=250) is V.UNKNOWN_PID


def test_restore_overrides_are_checked_as_settings_not_as_damage() -> None:
    table = ProducerStateTable(capacity=4, lifetime_ms=1000)
    for pid in (1, 2, 3):
        one(table, pid, 0, 0)
    snap = table.snapshot()
    with pytest.raises(ValueError, match="capacity >= 3"):
        ProducerStateTable.restore(snap, capacity=2)
    with pytest.raises(ValueError, match="lifetime_ms must be an int"):
        ProducerStateTable.restore(snap, lifetime_ms=0)
    with pytest.raises(TypeError, match="capactiy"):
        ProducerStateTable.restore(snap, capactiy=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="window"):
        rebuild(None, [], capacity=4, lifetime_ms=1000, window=3)  # type: ignore[call-arg]
    bigger = ProducerStateTable.restore(snap, capacity=3, reorder_window=0)
    assert (bigger.capacity, bigger.reorder_window) == (3, 0)
    assert [bigger.get(p) for p in (1, 2, 3)] == [table.get(p) for p in (1, 2, 3)]


def test_held_refs_survive_a_snapshot_as_tuples() -> None:
    table = ProducerStateTable(capacity=4, lifetime_ms=1000)
    one(table, 1, 0, 0)
    table.offer(1, 0, 2, 0, ref=(7, b"k", "v"))
    restored = ProducerStateTable.restore(table.snapshot())
    assert verdicts(restored.offer(1, 0, 1, 0, ref="s1")) == [
        ("s1", V.APPENDED),
        ((7, b"k", "v"), V.APPENDED),
    ]


def test_rebuild_from_a_damaged_snapshot_raises_corrupt_snapshot() -> None:
    table = ProducerStateTable(capacity=4, lifetime_ms=1000)
    one(table, 1, 0, 0)
    snap = bytearray(table.snapshot())
    snap[-1] ^= 0xFF
    with pytest.raises(CorruptSnapshot, match="CRC"):
        rebuild(bytes(snap), [])
    assert not CorruptSnapshot.retriable


def test_numpy_integers_are_accepted_and_bad_timestamps_refused() -> None:
    table = ProducerStateTable(capacity=2, lifetime_ms=1000)
    (d,) = table.offer(np.int64(1), np.int32(0), np.uint64(0), np.int64(5), ref="np")
    assert d.verdict is V.APPENDED
    assert type(table.clock) is int
    assert one(table, 1, True, 1) is V.MALFORMED  # bool is not a generation
    before = table.state()
    with pytest.raises(TypeError, match="ts_ms must be an int"):
        table.offer(1, 0, 1, 6.5)
    with pytest.raises(TypeError, match="ts_ms must be an int"):
        table.offer_header(None, "7")
    assert table.state() == before
    table.snapshot()  # the clock stayed an exact int, so this serialises


def test_no_record_within_kafkas_timestamp_bound_expires_a_live_lease() -> None:
    # Lifetime 30 min, grace = Kafka's default log.message.timestamp.after.max.ms (1 h). A
    # header-less record 40 min ahead lands (it is appended) and moves the clock, yet the live
    # producer keeps appending; a rejected far-future record does not even move the clock.
    minute = 60_000
    table = ProducerStateTable(capacity=2, lifetime_ms=30 * minute, grace_ms=60 * minute)
    assert one(table, 1, 0, 0, ts=0) is V.APPENDED
    assert one(table, 2, 0, 5, ts=10 * 24 * 60 * minute) is V.UNKNOWN_PID
    assert table.clock == 0
    assert table.offer_header(None, 40 * minute)[0].verdict is V.NON_IDEMPOTENT
    assert one(table, 1, 0, 1, ts=1 * minute) is V.APPENDED
    assert one(table, 1, 0, 2, ts=29 * minute) is V.APPENDED
    # Only past lifetime + grace of the first record does the entry end.
    assert one(table, 1, 0, 3, ts=90 * minute) is V.UNKNOWN_PID
