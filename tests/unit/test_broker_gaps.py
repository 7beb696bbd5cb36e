"""Gap resolution and adoption beyond the horizon (DESIGN §4 amended again).

The default table keeps the proposal's rules (the other broker tests); these tests turn the two
extensions on and hold them to the reference model, the batch path to ``offer``, and the state to
a function of the committed output, as the default rules are held.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import Gap, ProducerStateTable, replay_batch
from pidfence.wire import Verdict, encode_pf
from tests.unit.broker_streams import (
    StreamKnobs,
    flush_alike,
    knobs_strategy_of,
    make_stream,
    note_batch,
    offer_alike,
    offer_one_by_one,
    table_args,
    twin_tables,
)

knobs_strategy = knobs_strategy_of(
    6, 220, 0.1, loss_rate=st.floats(0, 0.15), late_start_rate=st.floats(0, 1)
)
#: Where the reader opens a horizon: before these record indexes (the stream's own time there).
horizons = st.lists(st.integers(0, 220), max_size=3)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _gap_tuples(gaps: list[Gap]) -> list[tuple[Any, ...]]:
    return [(g.pid, g.generation, g.first, g.last, g.ref, g.kind) for g in gaps]


@SETTINGS
@given(st.integers(0, 2**32), knobs_strategy, table_args, horizons, st.booleans())
def test_extensions_match_the_reference_model(
    seed: int, knobs: StreamKnobs, args: Any, opens: list[int], gaps_on: bool
) -> None:
    stream = make_stream(random.Random(seed), knobs)
    table, ref = twin_tables(args, resolve_gaps=gaps_on)
    offer_alike(table, ref, stream, opens=opens)
    flush_alike(table, ref, stream)
    assert _gap_tuples(table.gaps) == ref.gaps


@SETTINGS
@given(
    st.integers(0, 2**32),
    knobs_strategy,
    table_args,
    st.lists(st.integers(1, 60), max_size=8),
    st.booleans(),
)
def test_batch_path_with_extensions_decides_exactly_like_offer(
    seed: int, knobs: StreamKnobs, args: Any, cuts: list[int], gaps_on: bool
) -> None:
    capacity, lifetime, window = args
    stream = make_stream(random.Random(seed), knobs)
    # The horizon opens at the start of batches (where the sink opens it).
    bounds = np.cumsum([0, *cuts]).tolist()
    opens = [b for b in bounds if b < len(stream)][:2]
    one = ProducerStateTable(capacity, lifetime, window, resolve_gaps=gaps_on)
    expected_final, expected_log = offer_one_by_one(one, stream, opens)

    batched = ProducerStateTable(capacity, lifetime, window, resolve_gaps=gaps_on)
    final: dict[int, Verdict] = {}
    log: list[int] = []
    edges = sorted({*(b for b in bounds if b < len(stream)), len(stream)})
    for lo, hi in itertools.pairwise(edges):
        if lo in opens:
            batched.open_horizon(stream[lo][1])
        chunk = stream[lo:hi]
        result = batched.offer_batch(
            [h for h, _ in chunk],
            np.array([t for _, t in chunk], np.int64),
            refs=list(range(lo, hi)),
        )
        note_batch(result, lo, final, log)
    assert final == expected_final
    assert log == expected_log
    assert batched == one
    assert _gap_tuples(batched.gaps) == _gap_tuples(one.gaps)


@SETTINGS
@given(
    st.integers(0, 2**32),
    knobs_strategy,
    table_args,
    st.lists(st.integers(0, 60), max_size=8),
    st.data(),
)
def test_state_with_extensions_is_a_function_of_the_committed_output(
    seed: int, knobs: StreamKnobs, args: Any, cuts: list[int], data: st.DataObject
) -> None:
    """Rebuilt from any older snapshot plus the committed batches (with the horizons they
    opened), the state equals the live one and decides the same from then on."""
    capacity, lifetime, window = args
    stream = make_stream(random.Random(seed), knobs)
    live = ProducerStateTable(capacity, lifetime, window, resolve_gaps=True)
    snapshots: list[bytes | None] = [None]
    committed: list[tuple[list[Any], list[int], list[str], list[int], int | None]] = []
    start = 0
    for size in [*cuts, len(stream)]:
        lo, hi = start, min(len(stream), start + size)
        headers, stamps = [h for h, _ in stream[lo:hi]], [t for _, t in stream[lo:hi]]
        horizon = stamps[0] if stamps and data.draw(st.booleans(), label="open") else None
        if horizon is not None:
            live.open_horizon(horizon)
        res = live.offer_batch(headers, np.array(stamps, np.int64), list(range(lo, hi)))
        committed.append(
            (headers, stamps, [v.value for v in res.verdicts()], list(range(lo, hi)), horizon)
        )
        snapshots.append(live.snapshot())
        start = hi
    k = data.draw(st.integers(0, len(committed)), label="rebuild from snapshot")
    snap = snapshots[k]
    rebuilt = (
        ProducerStateTable(capacity, lifetime, window, resolve_gaps=True)
        if snap is None
        else ProducerStateTable.restore(snap)
    )
    for headers, stamps, verdicts, refs, horizon in committed[k:]:
        replay_batch(rebuilt, headers, stamps, verdicts, refs, horizon_ms=horizon)
    assert rebuilt == live
    more = make_stream(random.Random(seed + 1), knobs)
    base = live.clock if live.clock > -(2**62) else 0
    for i, (header, ts) in enumerate(more):
        assert live.offer_header(header, base + ts, 10_000 + i) == rebuilt.offer_header(
            header, base + ts, 10_000 + i
        ), f"record {i} after the rebuild"


# ------------------------------------------------------------------ the cases, by hand


def _offer_all(table: ProducerStateTable, seqs: list[int], pid: int = 7) -> list[Verdict]:
    out: list[Verdict] = []
    for i, s in enumerate(seqs):
        out += [d.verdict for d in table.offer(pid, 3, s, 1_000 + i, ref=i)]
    return out


def test_default_table_keeps_the_proposals_answers() -> None:
    """Seq 50 never reaches the log: the default rules refuse everything after the window."""
    table = ProducerStateTable(16, 86_400_000)
    verdicts = _offer_all(table, [*range(50), *range(51, 150)])
    assert verdicts.count(Verdict.APPENDED) == 50
    assert verdicts.count(Verdict.OUT_OF_ORDER) == 94
    assert table.gaps == []


def test_one_lost_record_is_reported_and_the_producer_continues() -> None:
    table = ProducerStateTable(16, 86_400_000, resolve_gaps=True)
    verdicts = _offer_all(table, [*range(50), *range(51, 150)])
    assert verdicts.count(Verdict.APPENDED) == 149
    assert Verdict.OUT_OF_ORDER not in verdicts
    assert table.gaps == [Gap(7, 3, 50, 50, 50, "lost")]  # ref 50 is seq 51's record
    assert table.get(7)[:2] == (3, 149)  # type: ignore[index]


def test_records_waiting_inside_the_window_stay_held() -> None:
    table = ProducerStateTable(16, 86_400_000, resolve_gaps=True)
    _offer_all(table, [0, 1, 3, 4, 5])
    assert table.held_count == 3 and table.gaps == []
    assert [d.verdict for d in table.offer(7, 3, 2, 2_000)] == [Verdict.APPENDED] * 4


def test_a_long_lost_run_is_one_gap() -> None:
    table = ProducerStateTable(16, 86_400_000, resolve_gaps=True)
    _offer_all(table, [0, 1, 2, 1000, 1001])
    assert table.gaps == [Gap(7, 3, 3, 999, 3, "lost")]
    assert table.get(7)[1] == 1001  # type: ignore[index]


def test_a_resend_of_a_skipped_seq_is_a_duplicate_and_fencing_still_holds() -> None:
    table = ProducerStateTable(16, 86_400_000, resolve_gaps=True)
    _offer_all(table, [0, 1, 9])  # window 5: seqs 2..8 reported lost
    assert (table.gaps[0].first, table.gaps[0].last) == (2, 8)
    assert [d.verdict for d in table.offer(7, 3, 4, 3_000)] == [Verdict.DUPLICATE]
    assert [d.verdict for d in table.offer(7, 2, 10, 3_000)] == [Verdict.FENCED]


def test_expiry_with_records_waiting_still_drops_them() -> None:
    """Only more records resolve a gap: a resumer that rolled to a successor re-sent them."""
    table = ProducerStateTable(16, 1_000, resolve_gaps=True)
    table.offer(7, 0, 0, 0)
    table.offer(7, 0, 2, 10, ref="two")
    out = table.offer(8, 0, 0, 1_000, ref="other")  # the clock passes pid 7's life
    assert [(d.ref, d.verdict) for d in out] == [
        ("other", Verdict.APPENDED),
        ("two", Verdict.OUT_OF_ORDER),
    ]
    assert table.gaps == []


def test_adoption_only_inside_the_horizon() -> None:
    table = ProducerStateTable(16, 1_000, grace_ms=100)
    assert [d.verdict for d in table.offer(7, 0, 5, 0)] == [Verdict.UNKNOWN_PID]
    table.open_horizon(500)  # adopt until 500 + 1000 + 100
    assert [d.verdict for d in table.offer(7, 0, 5, 600, ref="a")] == [Verdict.APPENDED]
    assert table.gaps == [Gap(7, 0, 0, 4, "a", "head")]
    assert [d.verdict for d in table.offer(7, 0, 6, 601)] == [Verdict.APPENDED]
    assert [d.verdict for d in table.offer(7, 0, 5, 602)] == [Verdict.DUPLICATE]
    assert [d.verdict for d in table.offer(8, 0, 9, 1_599)] == [Verdict.APPENDED]
    assert [d.verdict for d in table.offer(9, 0, 9, 1_600)] == [Verdict.UNKNOWN_PID]


def test_adoption_under_signing_needs_a_certificate() -> None:
    def verifier(pid: int, g: int, s: int, f: int, cert: bytes | None, now: int) -> str | None:
        return None if cert == b"good" else "unknown_key"

    table = ProducerStateTable(16, 1_000, verifier=verifier)
    table.open_horizon(0)
    assert [d.verdict for d in table.offer(7, 0, 5, 1)] == [Verdict.UNVERIFIED]
    assert [d.verdict for d in table.offer(7, 0, 6, 2, cert=b"bad")] == [Verdict.FORGED]
    assert [d.verdict for d in table.offer(7, 0, 7, 3, cert=b"good")] == [Verdict.APPENDED]
    assert table.forged == {"unknown_key": 1}
    assert [(g.first, g.last, g.kind) for g in table.gaps] == [(0, 6, "head")]


def test_snapshots_keep_the_settings_and_the_horizon() -> None:
    table = ProducerStateTable(16, 1_000, resolve_gaps=True)
    table.open_horizon(5)
    table.offer(7, 0, 3, 10)
    restored = ProducerStateTable.restore(table.snapshot())
    assert restored == table
    assert restored.resolve_gaps and restored.horizon == 1_005


@pytest.mark.parametrize("gaps_on", [False, True])
def test_the_batch_path_reports_the_same_gaps(gaps_on: bool) -> None:
    seqs = [*range(50), *range(51, 150)]
    headers = [encode_pf(7, 3, s) for s in seqs]
    table = ProducerStateTable(16, 86_400_000, resolve_gaps=gaps_on)
    res = table.offer_batch(headers, np.arange(len(seqs), dtype=np.int64) + 1_000)
    assert res.counts().get(Verdict.APPENDED, 0) == (149 if gaps_on else 50)
    assert [(g.first, g.last) for g in table.gaps] == ([(50, 50)] if gaps_on else [])
