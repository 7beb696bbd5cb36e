"""Gap resolution and adoption through the authority (DESIGN §4 amended again, a third time).

The default table keeps the proposal's rules (the other broker tests); these tests turn the two
extensions on with the sink's settings and hold them to the issue's four cases, holes, waiting
records and recorded answers; ``test_broker_gaps_properties.py`` holds them to the reference model,
the batch path to ``offer``, and the state to a function of the committed output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pidfence.broker_plugin import (
    MAX_HOLES,
    PENDING_LIMIT,
    CorruptSnapshot,
    Gap,
    ProducerStateTable,
    recorded_authority,
    replay_batch,
)
from pidfence.wire import FLAG_FENCE, PidState, PidStatus, Verdict, encode_pf
from tests.unit.broker_streams import fixed_authority, gap_tuples

DAY = 86_400_000
HOUR = 3_600_000
A, D, B, F = Verdict.APPENDED, Verdict.DUPLICATE, Verdict.BUFFERED, Verdict.FENCED


def sink_table(authority: Any = None, lifetime: int = DAY) -> ProducerStateTable:
    """A table with the sink's default settings (window 5, 1 h grace, gaps resolved)."""
    return ProducerStateTable(
        64, lifetime, 5, grace_ms=HOUR, resolve_gaps=True, authority=authority
    )


def live(pid: int, generation: int, expire_ms: int = 10 * DAY) -> Any:
    """An authority that knows one live pid."""
    return fixed_authority({pid: (generation, expire_ms)})


def verdicts(
    table: ProducerStateTable, records: list[tuple[int, int, int]], t0: int = 1_000
) -> list[tuple[Any, Verdict]]:
    """Offer ``(generation, seq, flags)`` records of pid 7 (ref = their index); every decision."""
    out: list[tuple[Any, Verdict]] = []
    for i, (g, s, flags) in enumerate(records):
        out += [(d.ref, d.verdict) for d in table.offer(7, g, s, t0 + i, flags, ref=i)]
    return out


def final(decisions: list[tuple[Any, Verdict]]) -> dict[Any, Verdict]:
    return dict(decisions)


# ------------------------------------------------------------------ the four cases


def test_case_1_a_timeout_hole_is_filled_by_the_resume() -> None:
    """g1 writes 0, 1, 4..10 (2 and 3 timed out in librdkafka's queue); the resume FENCEs g2 at
    seq 2 and re-sends 2..12. Was: 2 and 3 DUPLICATE (two acknowledged events lost)."""
    table = sink_table()
    g1 = [(1, s, 0) for s in (0, 1, *range(4, 11))]
    resume = [(2, 2, FLAG_FENCE)] + [(2, s, 0) for s in range(2, 13)]
    decided = final(verdicts(table, g1 + resume))
    appended = sorted(i for i, v in decided.items() if v is A)
    events = [(g1 + resume)[i][1] for i in appended]  # the event is the seq here
    assert sorted(events) == list(range(13))  # every event once
    assert [decided[i] for i in range(10, 12)] == [A, A]  # the re-sends of 2 and 3, filled
    assert [decided[i] for i in range(12, 19)] == [D] * 7  # 4..10 were appended under g1
    assert gap_tuples(table.gaps) == [
        (7, 1, 2, 3, 2, "lost"),
        (7, 2, 2, 2, 10, "filled"),
        (7, 2, 3, 3, 11, "filled"),
    ]
    assert table.open_holes(7) == []


def test_case_1_the_strict_rules_agree_per_event() -> None:
    """The proposal's rules on the same log append each event once too (under other records)."""
    strict = ProducerStateTable(64, DAY, 5)
    g1 = [(1, s, 0) for s in (0, 1, *range(4, 11))]
    resume = [(2, 2, FLAG_FENCE)] + [(2, s, 0) for s in range(2, 13)]
    decided = final(verdicts(strict, g1 + resume) + [(d.ref, d.verdict) for d in strict.flush(0)])
    events = sorted((g1 + resume)[i][1] for i, v in decided.items() if v is A)
    assert events == list(range(13))


def test_case_2_a_zombie_beyond_a_trimmed_head_is_fenced() -> None:
    """g1 wrote 0..9 and g2 FENCEd at 10, all trimmed; then the zombie (g1) and the successor
    (g2) interleave. Was: the zombie adopted, the successor's records DUPLICATE."""
    table = sink_table(live(7, 2))
    table.open_horizon(1_000)
    records = [(1, 10, 0), (2, 10, 0), (1, 11, 0), (2, 11, 0), (2, 12, 0), (1, 12, 0), (2, 13, 0)]
    decided = final(verdicts(table, records))
    assert [decided[i] for i in range(7)] == [F, A, F, A, A, F, A]
    assert gap_tuples(table.gaps) == [(7, 2, 0, 9, 1, "head")]


def test_case_2_across_two_sink_runs() -> None:
    """The zombie's records in one run, the successor's in the next (after a restart)."""
    first = sink_table(live(7, 2))
    first.open_horizon(1_000)
    run1 = verdicts(first, [(1, 10, 0), (1, 11, 0)])
    assert run1 == [(0, B), (1, B)]  # waiting: the log has not shown where they stand
    second = ProducerStateTable.restore(first.snapshot())
    second.authority = live(7, 2)
    run2 = [(d.ref, d.verdict) for d in second.offer(7, 2, 10, 2_000, ref="e10")]
    assert run2 == [(0, F), (1, F), ("e10", A)]


def test_case_2_records_before_the_next_generations_fence_are_adopted() -> None:
    """The other side of the same rule: g1's records the log shows before g2's FENCE are the
    producer's own (the strict rules append them), adopted when that FENCE arrives."""
    table = sink_table(live(7, 2))
    table.open_horizon(1_000)
    decided = verdicts(table, [(1, 10, 0), (1, 11, 0), (2, 12, FLAG_FENCE), (1, 12, 0), (2, 12, 0)])
    assert decided == [(0, B), (1, B), (0, A), (1, A), (2, Verdict.FENCE), (3, F), (4, A)]
    assert gap_tuples(table.gaps) == [(7, 1, 0, 9, 0, "head")]


def test_a_timeout_hole_in_an_adopted_head_is_filled_by_the_resume() -> None:
    """Adopted at seq 8 beyond a trimmed head (0..7 reported): seq 5 had timed out in
    librdkafka's queue and 6, 7 were trimmed, so nothing of the pid below 8 was appended. The
    resume FENCEs g2 at 5 and re-sends 5..9: 5..7 fill the head, 8 is a DUPLICATE. Was: 5..7
    DUPLICATE of records the sink never appended (event 5 lost; found by the simulation)."""
    table = sink_table(live(7, 1))
    table.open_horizon(1_000)
    resume = [(2, 5, FLAG_FENCE)] + [(2, s, 0) for s in range(5, 10)]
    zombie_and_again = [(1, 3, 0), (2, 5, 0)]
    decided = final(verdicts(table, [(1, 8, 0), *resume, *zombie_and_again]))
    assert [decided[i] for i in range(9)] == [A, Verdict.FENCE, A, A, A, D, A, F, D]
    assert gap_tuples(table.gaps) == [
        (7, 1, 0, 7, 0, "head"),
        (7, 2, 5, 5, 2, "filled"),
        (7, 2, 6, 6, 3, "filled"),
        (7, 2, 7, 7, 4, "filled"),
    ]
    assert table.open_holes(7) == [(0, 4)]


def test_the_batch_path_fills_an_open_hole_in_a_later_batch() -> None:
    """The resume's FENCE in one batch, its re-sends in the next: the batch path must fill the
    hole (up to its last seq) as ``offer`` does, not call the re-sends duplicates."""
    one, batched = (sink_table(live(7, 1)) for _ in range(2))
    for table in (one, batched):
        table.open_horizon(1_000)
        verdicts(table, [(1, 8, 0), (2, 5, FLAG_FENCE)])
    resends = [(2, s, 0) for s in (7, 8, 9)]
    strict = [v for _, v in verdicts(one, resends, t0=1_100)]
    assert strict == [A, D, A]
    headers = [encode_pf(7, g, s) for g, s, _ in resends]
    stamps = np.arange(1_100, 1_103, dtype=np.int64)
    assert batched.offer_batch(headers, stamps).verdicts() == [v.value for v in strict]


def test_without_gap_resolution_an_adopted_head_stays_closed() -> None:
    """``resolveGaps=false`` keeps the proposal's answer below the adoption: DUPLICATE."""
    table = ProducerStateTable(64, DAY, 5, grace_ms=HOUR, authority=live(7, 1))
    table.open_horizon(1_000)
    decided = final(verdicts(table, [(1, 8, 0), (2, 5, FLAG_FENCE), (2, 5, 0)]))
    assert [decided[i] for i in range(3)] == [A, Verdict.FENCE, D]
    assert table.open_holes(7) == []


def test_a_known_producer_behind_the_authority_is_not_appended_by_the_batch_path() -> None:
    """Pid 7 wrote seqs 0..2 at generation 0, then offsets were lost (the horizon opens) and the
    authority says generation 1 is live: pid 7's next record at generation 0 may be a zombie's
    and must wait for the log to show where it stands, on the batch path as on the strict one
    (the batch path's fast lane skipped the confirmation and appended it)."""
    one, batched = (sink_table(live(7, 1)) for _ in range(2))
    for table in (one, batched):
        for seq in range(3):
            assert [d.verdict for d in table.offer(7, 0, seq, 1_000 + seq)] == [A]
        table.open_horizon(2_000)
    strict = [d.verdict for d in one.offer(7, 0, 3, 2_000)]
    assert strict == [B]
    assert batched.offer_batch([encode_pf(7, 0, 3)], np.array([2_000], np.int64)).verdicts() == [
        v.value for v in strict
    ]


def test_case_3_an_expired_pid_is_not_adopted_again() -> None:
    """A pid whose entry expired while the sink ran, met again at seq > 0 inside a horizon.
    Was: adopted, and its re-sends of appended seqs appended a second time."""
    table = sink_table(live(7, 0, expire_ms=900), lifetime=1_000)
    table.grace_ms = 0
    assert [v for _, v in verdicts(table, [(0, s, 0) for s in range(6)], t0=0)] == [A] * 6
    table.offer(8, 0, 0, 1_500)  # the clock passes pid 7's life: its entry expires
    assert table.get(7) is None
    table.open_horizon(1_500)  # offsets lost: from here the sink could not see starts
    for s in range(3, 6):
        assert [d.verdict for d in table.offer(7, 0, s, 1_600)] == [Verdict.UNKNOWN_PID]


def test_case_4_settling_keeps_the_logs_order() -> None:
    """g1's 4 reached the log after g2's 5: settling after g2 moves the generation must not
    append it. Was: appended (a zombie's record). The highwater never moves back."""
    table = sink_table()
    records = [(1, 0, 0), (1, 1, 0), (1, 3, 0), (2, 5, 0), (1, 4, 0), (2, 2, FLAG_FENCE)]
    records += [(2, 2, 0), (2, 3, 0), (2, 4, 0)]
    highs = []
    decided: list[tuple[Any, Verdict]] = []
    for i, (g, s, flags) in enumerate(records):
        decided += [(d.ref, d.verdict) for d in table.offer(7, g, s, 1_000 + i, flags, ref=i)]
        highs.append(table.get(7)[1])  # type: ignore[index]
    got = final(decided)
    assert got[2] is A  # g1's 3 arrived before g2's 5: the log shows it before the move
    assert got[4] is F  # g1's 4 arrived after g2's 5
    assert [got[i] for i in (6, 7, 8, 3)] == [A, D, A, A]  # 2 fills the hole, then 4 and 5
    assert highs == sorted(highs)
    appended = sorted(records[i][1] for i, v in got.items() if v is A)
    assert appended == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------------ holes


def test_one_lost_record_is_reported_and_the_producer_continues() -> None:
    table = sink_table()
    decided = final(verdicts(table, [(3, s, 0) for s in (*range(50), *range(51, 150))]))
    assert list(decided.values()).count(A) == 149
    assert Verdict.OUT_OF_ORDER not in decided.values()
    assert table.gaps == [Gap(7, 3, 50, 50, 50, "lost")]  # ref 50 is seq 51's record
    assert table.get(7)[:2] == (3, 149)  # type: ignore[index]
    assert table.open_holes(7) == [(50, 50)]
    assert [d.verdict for d in table.offer(7, 3, 50, 5_000, ref="late")] == [A]
    assert table.gaps[-1] == Gap(7, 3, 50, 50, "late", "filled")
    assert [d.verdict for d in table.offer(7, 3, 50, 5_001)] == [D]


def test_the_default_table_keeps_the_proposals_answers() -> None:
    """Seq 50 never reaches the log: the default rules refuse everything after the window."""
    table = ProducerStateTable(16, DAY)
    decided = final(verdicts(table, [(3, s, 0) for s in (*range(50), *range(51, 150))]))
    assert list(decided.values()).count(A) == 50
    assert list(decided.values()).count(Verdict.OUT_OF_ORDER) == 94
    assert table.gaps == []


def test_records_waiting_inside_the_window_stay_held() -> None:
    table = sink_table()
    verdicts(table, [(3, s, 0) for s in (0, 1, 3, 4, 5)])
    assert table.held_count == 3 and table.gaps == []
    assert [d.verdict for d in table.offer(7, 3, 2, 2_000)] == [A] * 4


def test_fills_need_the_generation_rules_too() -> None:
    table = sink_table()
    verdicts(table, [(3, s, 0) for s in (0, 1, 9)])  # window 5: 2..8 skipped, kept open
    assert table.open_holes(7) == [(2, 8)]
    assert [d.verdict for d in table.offer(7, 2, 4, 3_000)] == [F]  # an older generation
    assert [d.verdict for d in table.offer(7, 5, 4, 3_000)] == [Verdict.INVALID_GENERATION]
    assert [d.verdict for d in table.offer(7, 4, 4, 3_000)] == [A]  # the next one: filled
    assert table.get(7)[:2] == (4, 9)  # type: ignore[index]
    assert table.open_holes(7) == [(2, 3), (5, 8)]


def test_past_the_hole_limit_a_gap_is_not_skipped() -> None:
    """A producer keeps MAX_HOLES open holes; its next gap is refused by name, never dropped."""
    table = sink_table()
    seqs = [0]
    for k in range(MAX_HOLES):
        base = 10 * k
        seqs += [base + 8, base + 9]  # 8 past the highwater: the gap below is skipped
    decided = final(verdicts(table, [(3, s, 0) for s in seqs]))
    assert len(table.open_holes(7)) == MAX_HOLES
    assert Verdict.OUT_OF_ORDER not in decided.values()
    high = table.get(7)[1]  # type: ignore[index]
    assert [d.verdict for d in table.offer(7, 3, high + 9, 9_000)] == [Verdict.OUT_OF_ORDER]
    # Filling one hole makes room again.
    assert [d.verdict for d in table.offer(7, 3, 1, 9_001)] == [A]
    assert [d.verdict for d in table.offer(7, 3, 2, 9_002)] == [A]  # splits nothing: ok


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


# ------------------------------------------------------------------ adoption


def test_no_authority_no_adoption() -> None:
    table = ProducerStateTable(16, 1_000, grace_ms=100)
    table.open_horizon(500)
    assert [d.verdict for d in table.offer(7, 0, 5, 600)] == [Verdict.UNKNOWN_PID]
    assert [d.verdict for d in table.offer(8, 0, 0, 600)] == [A]  # a start is no adoption


def test_adoption_only_inside_the_horizon_and_at_the_authoritys_generation() -> None:
    answers = {7: (0, 5_000), 8: (0, 5_000), 9: (0, 5_000), 10: (3, 5_000), 11: (1, 5_000)}
    table = ProducerStateTable(16, 1_000, grace_ms=100, authority=fixed_authority(answers))
    assert [d.verdict for d in table.offer(7, 0, 5, 0)] == [Verdict.UNKNOWN_PID]
    table.open_horizon(500)  # adopt until 500 + 1000 + 100
    assert [d.verdict for d in table.offer(7, 0, 5, 600, ref="a")] == [A]
    assert table.gaps == [Gap(7, 0, 0, 4, "a", "head")]
    assert [d.verdict for d in table.offer(7, 0, 6, 601)] == [A]
    assert [d.verdict for d in table.offer(7, 0, 5, 602)] == [D]
    assert [d.verdict for d in table.offer(8, 0, 9, 1_599)] == [A]
    assert [d.verdict for d in table.offer(9, 0, 9, 1_600)] == [Verdict.UNKNOWN_PID]
    table.open_horizon(1_600)
    assert [d.verdict for d in table.offer(10, 4, 9, 1_600)] == [Verdict.INVALID_GENERATION]
    assert [d.verdict for d in table.offer(12, 0, 9, 1_600)] == [Verdict.UNKNOWN_PID]  # unknown
    assert [d.verdict for d in table.offer(11, 0, 0, 1_600)] == [B]  # waits, even at seq 0


def test_an_ended_lease_is_never_adopted_nor_started() -> None:
    table = ProducerStateTable(16, 10_000, authority=live(7, 0, expire_ms=700))
    table.open_horizon(500)
    assert [d.verdict for d in table.offer(7, 0, 5, 699)] == [A]
    table2 = ProducerStateTable(16, 10_000, authority=live(7, 0, expire_ms=700))
    table2.open_horizon(500)
    for s, flags in ((5, 0), (0, 0), (3, FLAG_FENCE)):
        assert [d.verdict for d in table2.offer(7, 0, s, 700, flags)] == [Verdict.UNKNOWN_PID]


@pytest.mark.parametrize(
    ("state", "seq", "verdict"),
    [
        (PidState.RETIRED, 3, A),  # rolled, lease still live: its final generation is adopted
        (PidState.ENDED, 0, Verdict.UNKNOWN_PID),  # an ended lease is not even started again
    ],
)
def test_retired_and_ended_answers_are_the_authoritys_word(
    state: PidState, seq: int, verdict: Verdict
) -> None:
    """A retired or ended pid is known to the authority: its answer decides (an ended lease,
    here ended at 1_500, refuses even a seq 0, which an unknown pid's would start)."""
    expire = 5_000 if state is PidState.RETIRED else 1_500
    table = sink_table(lambda pid: PidStatus(pid, state, 1, expire))
    table.open_horizon(1_000)
    assert [d.verdict for d in table.offer(7, 1, seq, 2_000)] == [verdict]


def test_waiting_records_end_with_the_lease_or_a_flush() -> None:
    table = ProducerStateTable(16, 10_000, grace_ms=50, authority=live(7, 2, expire_ms=800))
    table.open_horizon(500)
    assert [d.verdict for d in table.offer(7, 1, 4, 600, ref="w")] == [B]
    assert table.held_count == 1
    # The record that moves the clock past the lease end (plus the grace) comes first.
    assert [(d.ref, d.verdict) for d in table.offer(8, 0, 0, 850, ref="x")] == [
        ("x", A),
        ("w", F),
    ]
    table.offer(7, 1, 5, 600, ref="w2")  # ended at 800: refused, not waiting
    assert table.held_count == 0
    again = ProducerStateTable(16, 10_000, authority=live(7, 2))
    again.open_horizon(500)
    again.offer(7, 1, 4, 600, ref="w")
    assert [(d.ref, d.verdict) for d in again.flush(again.clock)] == [("w", F)]


def test_waiting_is_bounded() -> None:
    """Past PENDING_LIMIT waiting records the wait ends: they are FENCED, by name."""
    table = ProducerStateTable(16, DAY, authority=live(7, 2))
    table.open_horizon(0)
    out = [d.verdict for s in range(PENDING_LIMIT + 1) for d in table.offer(7, 1, 10 + s, 1)]
    assert out == [B] * PENDING_LIMIT + [F] * PENDING_LIMIT + [B]
    assert table.held_count == 1


def test_a_chain_of_fences_up_to_the_authoritys_generation_proves_waiting_records() -> None:
    """The pid was bumped twice since: its g1 records wait through g2's FENCE (and g2's
    records) until g3's FENCE shows they all came first, as the strict rules would see."""
    table = ProducerStateTable(16, DAY, authority=live(7, 3))
    table.open_horizon(0)
    records = [(1, 4, 0), (2, 5, FLAG_FENCE), (1, 5, 0), (2, 5, 0), (3, 6, FLAG_FENCE), (3, 6, 0)]
    decided = verdicts(table, records)
    assert decided == [
        (0, B),
        (1, B),
        (2, F),  # g1 after g2's FENCE: a zombie's, on its own
        (3, B),
        (0, A),  # g3's FENCE: the chain is whole
        (1, Verdict.FENCE),
        (3, A),
        (4, Verdict.FENCE),
        (5, A),
    ]


def test_a_broken_chain_fences_the_waiting_records() -> None:
    """g2's FENCE went with retention: a g2 data record (or a FENCE further ahead) after the
    waiting g1 records proves nothing; they are FENCED and the record is judged afresh."""
    for breaker in ((2, 5, 0), (3, 5, FLAG_FENCE)):
        table = ProducerStateTable(16, DAY, authority=live(7, 3))
        table.open_horizon(0)
        decided = verdicts(table, [(1, 4, 0), breaker])
        assert decided[:2] == [(0, B), (0, F)]


def test_adoption_under_signing_needs_a_certificate() -> None:
    def verifier(pid: int, g: int, s: int, f: int, cert: bytes | None, now: int) -> str | None:
        return None if cert == b"good" else "unknown_key"

    table = ProducerStateTable(16, 1_000, verifier=verifier, authority=live(7, 0))
    table.open_horizon(0)
    assert [d.verdict for d in table.offer(7, 0, 5, 1)] == [Verdict.UNVERIFIED]
    assert [d.verdict for d in table.offer(7, 0, 6, 2, cert=b"bad")] == [Verdict.FORGED]
    assert [d.verdict for d in table.offer(7, 0, 7, 3, cert=b"good")] == [A]
    assert table.forged == {"unknown_key": 1}
    assert [(g.first, g.last, g.kind) for g in table.gaps] == [(0, 6, "head")]
    waiting = ProducerStateTable(16, 1_000, verifier=verifier, authority=live(7, 1))
    waiting.open_horizon(0)
    assert [d.verdict for d in waiting.offer(7, 0, 5, 1)] == [Verdict.UNVERIFIED]
    assert [d.verdict for d in waiting.offer(7, 0, 6, 2, cert=b"bad")] == [Verdict.FORGED]
    assert [d.verdict for d in waiting.offer(7, 0, 7, 3, cert=b"good")] == [B]


# ------------------------------------------------------------------ snapshots and replays


def test_snapshots_keep_holes_waiting_records_and_the_horizon() -> None:
    table = sink_table(live(9, 4))
    table.open_horizon(5)
    verdicts(table, [(3, s, 0) for s in (0, 1, 9)])
    table.offer(9, 3, 3, 10, ref=(1, 2))
    restored = ProducerStateTable.restore(table.snapshot())
    assert restored == table
    assert restored.resolve_gaps and restored.horizon == 5 + DAY + HOUR
    assert restored.open_holes(7) == [(2, 8)]
    assert [h.ref for h in restored.waiting()] == [(1, 2)]
    # Deltas carry them too.
    base = restored.snapshot()
    restored.offer(7, 3, 4, 11)
    restored.authority = live(9, 4)
    restored.offer(9, 3, 4, 12, ref=(3, 4))
    chained = ProducerStateTable.restore_chain(base, [restored.snapshot_delta()])
    assert chained == restored
    assert chained.open_holes(7) == [(2, 3), (5, 8)]


def test_a_replay_without_the_recorded_answer_is_refused() -> None:
    table = sink_table()
    table.open_horizon(0)
    with pytest.raises(CorruptSnapshot, match="pid 7"):
        replay_batch(table, [encode_pf(7, 1, 5)], [1], ["UNKNOWN_PID"], answers={})


@pytest.mark.parametrize("gaps_on", [False, True])
def test_the_batch_path_reports_the_same_gaps(gaps_on: bool) -> None:
    seqs = [*range(50), *range(51, 150)]
    headers = [encode_pf(7, 3, s) for s in seqs]
    table = ProducerStateTable(16, DAY, resolve_gaps=gaps_on)
    res = table.offer_batch(headers, np.arange(len(seqs), dtype=np.int64) + 1_000)
    assert res.counts().get(A, 0) == (149 if gaps_on else 50)
    assert [(g.first, g.last) for g in table.gaps] == ([(50, 50)] if gaps_on else [])


def test_recorded_authority_answers_what_was_recorded() -> None:
    status = PidStatus(7, PidState.RETIRED, 3, 99)
    assert recorded_authority({7: status})(7) == status


def test_at_the_hole_limit_a_fill_that_would_split_a_hole_waits() -> None:
    """With MAX_HOLES holes open, a record inside one (not at its edge) is OUT_OF_ORDER and
    nothing changes: splitting would keep MAX_HOLES + 1 holes, a state no snapshot restores."""
    table = sink_table()
    seqs = [0]
    for k in range(MAX_HOLES):
        seqs += [10 * k + 8, 10 * k + 9]  # each skipped gap leaves a hole of 7 or 8 seqs
    verdicts(table, [(3, s, 0) for s in seqs])
    before = table.open_holes(7)
    assert len(before) == MAX_HOLES
    assert before[0] == (1, 7)

    assert [d.verdict for d in table.offer(7, 3, 4, 9_000)] == [Verdict.OUT_OF_ORDER]
    assert table.open_holes(7) == before
    # An edge still fills (it shrinks the hole), and the state still restores.
    assert [d.verdict for d in table.offer(7, 3, 1, 9_001)] == [A]
    assert [d.verdict for d in table.offer(7, 3, 4, 9_002)] == [Verdict.OUT_OF_ORDER]
    assert table.open_holes(7) == [(2, 7), *before[1:]]
    assert ProducerStateTable.restore(table.snapshot()) == table


@pytest.mark.parametrize("known_before", [True, False], ids=["confirmed", "adopted"])
@pytest.mark.parametrize(("ts", "verdict"), [(4_999, A), (5_000, Verdict.INVALID_GENERATION)])
def test_a_generation_leap_is_vouched_only_while_the_lease_is_live(
    known_before: bool, ts: int, verdict: Verdict
) -> None:
    """Inside a horizon, a known producer's record two generations ahead (the FENCEs between
    not read) moves the entry only while the authority's lease is live: a lease ending at
    5_000 has ended at 5_000, as :meth:`ask` judges an unknown pid's. The pid is known from
    before the horizon (asked about at its next record) or adopted inside it."""
    table = sink_table(live(7, 1))
    if not known_before:
        table.open_horizon(1_000)
    assert [v for _, v in verdicts(table, [(1, 0, 0)])] == [A]
    if known_before:
        table.open_horizon(1_000)
    table.authority = live(7, 3, expire_ms=5_000)  # the producer bumped twice since
    assert [d.verdict for d in table.offer(7, 3, 1, ts)] == [verdict]


@pytest.mark.parametrize(("after", "verdict"), [(-1, B), (0, A)])
def test_a_known_producer_is_confirmed_only_inside_the_horizon(
    after: int, verdict: Verdict
) -> None:
    """Pid 7 is known when offsets are lost, and the authority names a newer generation: its
    next record at the old one waits (it may be a zombie's) inside the horizon, which ends
    (exclusive) one entry life after the point; from there the rules judge it as they see it."""
    table = sink_table(live(7, 1))
    assert [v for _, v in verdicts(table, [(0, 0, 0)])] == [A]
    table.open_horizon(500)
    assert [d.verdict for d in table.offer(7, 0, 1, table.horizon + after)] == [verdict]
