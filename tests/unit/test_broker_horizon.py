"""A producer the table knew before a horizon, and entries whose life changed: what the lease
authority may prove, and what it may not (DESIGN §4 amended a third time).

After offsets the sink never read, the authority's current generation of a known pid is all it
proves: a record of an older generation (the entry's, or one between) may be a zombie's, written
after a FENCE that was not read, and waits for the log to show where it stands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pidfence.broker_plugin import ProducerStateTable
from pidfence.wire import FLAG_FENCE, Verdict, encode_pf
from tests.unit.broker_streams import FakeVerifier, fixed_authority, good
from tests.unit.test_broker_gaps import DAY, sink_table

A, B, F = Verdict.APPENDED, Verdict.BUFFERED, Verdict.FENCED


def _known_then_lost(authority: Any) -> ProducerStateTable:
    """Pid 7 wrote seqs 0..10 at generation 0; then the offsets after them were not read."""
    table = sink_table(authority)
    for seq in range(11):
        assert [d.verdict for d in table.offer(7, 0, seq, 1_000 + seq)] == [A]
    table.open_horizon(5_000)
    return table


def test_a_known_producers_record_between_its_generation_and_the_authoritys_waits() -> None:
    """Resume A took pid 7 to generation 1 and paused; resume B took it to 2 from A's
    checkpoint; retention deleted FENCE 1, A's records and FENCE 2 unread; A wakes and writes at
    generation 1. The strict rules on the whole log FENCE it. Was: the entry moved to 1 and A's
    records were APPENDED (B's re-sends of those seqs then DUPLICATE)."""
    strict = ProducerStateTable(64, DAY, 5)
    for seq in range(11):
        strict.offer(7, 0, seq, 1_000 + seq)
    strict.offer(7, 1, 11, 2_000, FLAG_FENCE)
    for seq in range(11, 16):
        strict.offer(7, 1, seq, 2_001 + seq)
    strict.offer(7, 2, 16, 3_000, FLAG_FENCE)
    assert [d.verdict for d in strict.offer(7, 1, 16, 5_000)] == [F]

    table = _known_then_lost(fixed_authority({7: (2, 10 * DAY)}))
    assert [d.verdict for d in table.offer(7, 1, 16, 5_000, ref="a16")] == [B]
    assert [d.verdict for d in table.offer(7, 1, 17, 5_001, ref="a17")] == [B]
    assert table.get(7) == (0, 10, 1_000)
    # B's next record, at the authority's generation without its FENCE: A's records are FENCED.
    decided = {d.ref: d.verdict for d in table.offer(7, 2, 18, 5_002, ref="b18")}
    assert decided["a16"] is F and decided["a17"] is F

    batched = _known_then_lost(fixed_authority({7: (2, 10 * DAY)}))
    headers = [encode_pf(7, 1, 16), encode_pf(7, 1, 17)]
    assert batched.offer_batch(headers, np.array([5_000, 5_001])).verdicts() == [B.value] * 2


def test_records_between_the_generations_that_the_log_shows_before_the_fence_are_appended() -> None:
    """The same wait, when the log does show FENCE 2 after the generation-1 records: they
    came before it, as the strict rules see them, and are appended in their order."""
    table = _known_then_lost(fixed_authority({7: (2, 10 * DAY)}))
    decided: dict[Any, Verdict] = {}
    records = [(1, 11, FLAG_FENCE), (1, 11, 0), (1, 12, 0), (2, 13, FLAG_FENCE), (2, 13, 0)]
    for i, (g, s, flags) in enumerate(records):
        decided |= {d.ref: d.verdict for d in table.offer(7, g, s, 5_000 + i, flags, ref=i)}
    assert [decided[i] for i in range(5)] == [Verdict.FENCE, A, A, Verdict.FENCE, A]
    assert table.get(7) == (2, 13, 1_000)


def test_the_authority_vouches_for_its_current_generation_only() -> None:
    """Pid 7, confirmed after the horizon at generation 0; then the authority names generation
    3. Without a verifier a leap to 2 (a generation the log never showed a FENCE of) is
    refused, as the strict rules refuse it; one to 3, the authority's own, is taken. Was: any
    generation up to the authority's was vouched for, and a leap to 2 was APPENDED."""
    answers: dict[int, tuple[int, int] | None] = {7: (0, 10 * DAY)}
    table = _known_then_lost(fixed_authority(answers))
    assert [d.verdict for d in table.offer(7, 0, 11, 5_000)] == [A]  # confirmed at 0
    answers[7] = (3, 10 * DAY)
    assert [d.verdict for d in table.offer(7, 2, 12, 5_001)] == [Verdict.INVALID_GENERATION]
    assert [d.verdict for d in table.offer(7, 3, 12, 5_002)] == [A]
    assert table.get(7) == (3, 12, 1_000)


def test_a_shorter_lifetime_after_a_restore_never_gives_a_pid_two_slots() -> None:
    """A restart with a shorter lifetime left entries past their new life in the ring until the
    clock moved; a FENCE of such a pid stamped at the clock created a second slot for it, and
    the next snapshot could not be restored (CorruptSnapshot, pid duplicated): the sink was
    stuck, and with a full ring the table raised OverflowError."""
    table = ProducerStateTable(capacity=2, lifetime_ms=1_000)
    table.offer(1, 5, 0, 0)
    table.offer(2, 0, 0, 600)
    table = ProducerStateTable.restore(table.snapshot(), lifetime_ms=500)
    assert [d.verdict for d in table.offer(1, 6, 0, 600, flags=FLAG_FENCE)] == [Verdict.FENCE]
    assert [pid for pid, _ in table.ring] == [2, 1] and sorted(table.entries) == [1, 2]
    again = ProducerStateTable.restore(table.snapshot())
    assert again.get(1) == (6, -1, 600)
    # A full ring whose entries all passed their new life: a new pid takes a slot.
    full = ProducerStateTable(capacity=2, lifetime_ms=1_000)
    for pid, seq, ts in ((1, 0, 0), (2, 0, 100), (1, 1, 600)):
        full.offer(pid, 0, seq, ts)
    full = ProducerStateTable.restore(full.snapshot(), lifetime_ms=500)
    assert [d.verdict for d in full.offer(3, 0, 0, 600)] == [A]
    assert sorted(full.entries) == [3]
    assert ProducerStateTable.restore(full.snapshot()).get(3) == (0, 0, 600)


def test_pids_waiting_on_the_authority_take_places_of_the_capacity() -> None:
    """Records waiting for the log to show where they stand were bounded per pid (256), not in
    the number of pids: a table of capacity 2 held half a million records of 2,000 pids, and
    committed them all with every batch. Now a waiting pid counts as an entry does."""
    table = ProducerStateTable(
        2, DAY, authority=fixed_authority({p: (5, 10 * DAY) for p in (1, 2, 3)})
    )
    table.open_horizon(1_000)
    waits = [table.offer(pid, 4, 1, 1_000)[0].verdict for pid in (1, 2, 3)]
    assert waits == [B, B, Verdict.CAPACITY]
    assert sorted(table.pending) == [1, 2]


def _signed_known_then_lost(generation: int) -> ProducerStateTable:
    """Pid 7 wrote seqs 0..10 at generation 0 under signing; then offsets were not read, and
    the lease authority says ``generation`` is current."""
    table = ProducerStateTable(
        64,
        DAY,
        5,
        grace_ms=0,
        verifier=FakeVerifier(),
        resolve_gaps=True,
        authority=fixed_authority({7: (generation, 10 * DAY)}),
    )
    assert [d.verdict for d in table.offer(7, 0, 0, 1_000, cert=good(7, 0))] == [A]
    for seq in range(1, 11):
        assert [d.verdict for d in table.offer(7, 0, seq, 1_000 + seq)] == [A]
    table.open_horizon(5_000)
    return table


def test_a_forgery_after_a_horizon_does_not_confirm_its_pid() -> None:
    """An attacker's FENCE, the first record of pid 7 the sink read after the horizon, was
    refused, yet it had settled the question the authority answers: the zombie's record at the
    old generation after it was appended without a wait (the simulation's horizon-zombie world
    with forgeries, 11 seeds of 200). A forgery now changes nothing, and the zombie waits."""
    for forged in ((2, 11, None), (3, 11, None), (2, 11, good(7, 1))):
        table = _signed_known_then_lost(2)
        g, s, cert = forged
        refused = [d.verdict for d in table.offer(7, g, s, 5_000, FLAG_FENCE, cert=cert)]
        assert refused in ([Verdict.FORGED], [Verdict.INVALID_GENERATION]), forged
        assert table.get(7) == (0, 10, 1_000) and 7 in table.unconfirmed, forged
        assert [d.verdict for d in table.offer(7, 0, 11, 5_001)] == [B], forged


def test_a_fence_at_the_authoritys_generation_brings_its_certificate() -> None:
    """A FENCE without a certificate at the authority's generation was taken as vouched for
    (FENCE, the entry moved past the real one). Under signing a FENCE always carries its
    certificate: without one it is FORGED; with it, it moves the entry as before."""
    table = _signed_known_then_lost(1)
    assert [d.verdict for d in table.offer(7, 1, 11, 5_000, FLAG_FENCE)] == [Verdict.FORGED]
    assert table.get(7) == (0, 10, 1_000) and 7 in table.unconfirmed
    fence = table.offer(7, 1, 11, 5_001, FLAG_FENCE, cert=good(7, 1))
    assert [d.verdict for d in fence] == [Verdict.FENCE]
    assert table.get(7) == (1, 10, 1_000) and 7 not in table.unconfirmed
    # A data record at the authority's generation whose certificate went unread is vouched for.
    vouched = _signed_known_then_lost(1)
    assert [d.verdict for d in vouched.offer(7, 1, 11, 5_000)] == [A]


def test_a_forged_fence_ahead_of_waiting_records_does_not_end_their_wait() -> None:
    """Records waiting on the log, then a forged FENCE two generations ahead: it ended the wait
    and FENCED them, where a rebuild, which skips forgeries, went on waiting (the simulation's
    late-start world with an attacker: RebuildMismatch). It is FORGED and changes nothing."""
    table = _signed_known_then_lost(3)
    assert [d.verdict for d in table.offer(7, 0, 11, 5_000, ref="w")] == [B]
    before = table.state()
    assert [d.verdict for d in table.offer(7, 2, 12, 5_001, FLAG_FENCE)] == [Verdict.FORGED]
    assert table.state() == before
    # A data record of a newer generation without a certificate ends nothing either.
    assert [d.verdict for d in table.offer(7, 2, 12, 5_001)] == [Verdict.UNVERIFIED]
    assert table.state() == before


def test_records_waiting_behind_unread_seqs_are_appended_when_the_next_fence_is_confirmed() -> None:
    """Pid 7 at generation 0: seq 11 was in offsets the sink never read, seqs 12 and 13 wait
    behind it; more offsets go unread, then the resume's FENCE of generation 1, which the
    authority confirms. The strict rules, which read seq 11, append 12 and 13 before the FENCE.
    Was: the confirmation moved the generation without gap resolution, and the next record
    FENCED both as a zombie's (the resume's checkpoint covered them: their events were lost;
    simulation seed 6010 of the zombie-saves exploration)."""
    strict = ProducerStateTable(64, DAY, 5, resolve_gaps=True)
    for seq in range(14):
        strict.offer(7, 0, seq, 1_000 + seq)
    strict.offer(7, 1, 14, 2_000, FLAG_FENCE)
    assert strict.get(7) == (1, 13, 1_000)

    answers: dict[int, tuple[int, int] | None] = {7: (0, 10 * DAY)}
    table = _known_then_lost(fixed_authority(answers))
    decided: dict[Any, Verdict] = {}
    for seq in (12, 13):
        decided |= {d.ref: d.verdict for d in table.offer(7, 0, seq, 5_000 + seq, ref=seq)}
    assert decided == {12: B, 13: B}
    table.open_horizon(6_000)  # more offsets not read
    answers[7] = (1, 10 * DAY)
    decided |= {d.ref: d.verdict for d in table.offer(7, 1, 14, 6_000, FLAG_FENCE, ref="fence")}
    decided |= {d.ref: d.verdict for d in table.offer(7, 1, 14, 6_001, ref=14)}
    assert decided == {12: A, 13: A, "fence": Verdict.FENCE, 14: A}
    assert table.get(7) == (1, 14, 1_000)


def _stale(table: ProducerStateTable) -> ProducerStateTable:
    """Pid 7 wrote seqs 0 and 1 at generation 3; then the offsets after them were not read."""
    for seq in (0, 1):
        assert [d.verdict for d in table.offer(7, 3, seq, 1_000 + seq)] == [A]
    table.open_horizon(2_000)
    return table


def test_a_known_producers_window_counts_waiting_records_after_a_horizon() -> None:
    """Retention deleted seqs 2..4 of pid 7 unread; seq 5 timed out in librdkafka's queue and
    6..9 reached the log; a successor pid re-sends 5..9. The strict rules on the whole log append
    0..4 and never 6..9 (5 never comes). Counted from the stale highwater 1, 8 overflowed the
    window: the gap 2..5 was skipped and 6..9 appended, each event a second time under the
    successor. Counted by the records waiting, 6..9 wait and end refused."""
    table = _stale(sink_table(fixed_authority({7: (3, 10 * DAY)})))
    decided = [d.verdict for s in range(6, 10) for d in table.offer(7, 3, s, 3_000 + s)]
    assert decided == [B] * 4
    assert table.gaps == [] and table.get(7)[1] == 1  # type: ignore[index]
    flushed = {d.verdict for d in table.flush(3_100)}
    assert flushed == {Verdict.OUT_OF_ORDER}

    # Without the horizon, the distance rule skips from the highwater the sink saw land.
    seen = sink_table()
    for seq in (0, 1):
        seen.offer(7, 3, seq, 1_000 + seq)
    out = [d for s in range(6, 10) for d in seen.offer(7, 3, s, 3_000 + s, ref=s)]
    assert {d.ref: d.verdict for d in out} == {s: A for s in range(6, 10)}
    assert [(g.first, g.last, g.kind) for g in seen.gaps] == [(2, 5, "lost")]


def test_a_stale_window_full_of_waiting_records_skips_from_the_lowest() -> None:
    """When the window's worth of records wait, the gap below the lowest is reported lost
    (what a timeout hole right above the unread seqs would also be: docs/gaps.md) and the
    producer goes on from there; the highwater moved, so the distance rule is back."""
    table = _stale(sink_table(fixed_authority({7: (3, 10 * DAY)})))
    out = [d for s in range(6, 12) for d in table.offer(7, 3, s, 3_000 + s, ref=s)]
    assert {d.ref: d.verdict for d in out} == {s: A for s in range(6, 12)}
    assert [(g.first, g.last, g.kind) for g in table.gaps] == [(2, 5, "lost")]
    assert 7 not in table.stale
    assert [d.verdict for d in table.offer(7, 3, 19, 4_000)] == [A]  # 12..18 lost: distance 7
