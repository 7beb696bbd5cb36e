"""Property tests: the table against a reference model, the batch path against ``offer``,
snapshots (full and incremental) against the live table, and corruption detection."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.broker_plugin import CorruptSnapshot, ProducerStateTable, rebuild, replay_batch
from pidfence.broker_plugin.entry import MAX_HOLES
from pidfence.broker_plugin.snapshot import _frame, _unframe
from pidfence.wire import MalformedHeader, Verdict, decode_pf, encode_pf
from tests.unit import broker_streams as streams

knobs_strategy = streams.knobs_strategy_of(
    8,
    250,
    0.15,
    leap_rate=st.floats(0, 0.1),
    skew_rate=st.floats(0, 0.1),
    skew_ms=st.integers(0, 4000),
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.integers(0, 2**32), knobs_strategy, streams.table_args)
def test_table_matches_reference_model(seed: int, knobs: streams.StreamKnobs, args: Any) -> None:
    stream = streams.make_stream(random.Random(seed), knobs)
    table, ref = streams.twin_tables(args)
    streams.offer_alike(table, ref, stream)
    streams.flush_alike(table, ref, stream)


#: Multipliers that spread the stream's pids 1..8 over a span below 2**16, below 2**32 and
#: beyond: the batch path groups producers with a different sort for each.
PID_SPREADS = (1, 2**14 + 1, 2**29 + 7, 2**50 + 3)


def spread_pids(
    stream: list[tuple[bytes | None, int]], factor: int
) -> list[tuple[bytes | None, int]]:
    """The stream with every non-zero pid multiplied by ``factor`` (other headers unchanged)."""
    out: list[tuple[bytes | None, int]] = []
    for header, ts in stream:
        try:
            pf = decode_pf(header) if header is not None else None
        except MalformedHeader:
            pf = None
        if pf is not None and pf.pid:
            out.append((encode_pf(pf.pid * factor, pf.generation, pf.seq, pf.flags), ts))
        else:
            out.append((header, ts))
    return out


BATCHED_STREAMS = streams.batched_streams(knobs_strategy)


@SETTINGS
@given(*BATCHED_STREAMS, st.booleans(), st.sampled_from(PID_SPREADS))
def test_batch_path_decides_exactly_like_offer(
    seed: int,
    knobs: streams.StreamKnobs,
    args: Any,
    cuts: list[int],
    as_arrow: bool,
    spread: int,
) -> None:
    capacity, lifetime, window = args
    stream = spread_pids(streams.make_stream(random.Random(seed), knobs), spread)
    one_by_one = ProducerStateTable(capacity, lifetime, window)
    expected_final, expected_log = streams.offer_one_by_one(one_by_one, stream)

    batched = ProducerStateTable(capacity, lifetime, window)
    final: dict[int, Verdict] = {}
    log: list[int] = []
    for start, end, headers, stamps in streams.batches(stream, cuts):
        result = batched.offer_batch(
            pa.array(headers, type=pa.binary()) if as_arrow else headers,
            np.array(stamps, dtype=np.int64),
            refs=list(range(start, end)),
        )
        streams.note_batch(result, start, final, log)
    assert final == expected_final
    assert log == expected_log
    assert batched == one_by_one


def test_batch_fast_path_on_a_long_in_order_stream() -> None:
    rng = random.Random(7)
    records: list[tuple[bytes | None, int]] = []
    next_seq = dict.fromkeys(range(1, 51), 0)
    for i in range(20_000):
        pid = rng.randrange(1, 51)
        if rng.random() < 0.05 and next_seq[pid]:
            seq = next_seq[pid] - 1
        else:
            seq = next_seq[pid]
            next_seq[pid] += 1
        records.append((encode_pf(pid, 3, seq), i))
    a = ProducerStateTable(100, 10**9)
    expected_final, expected_log = streams.offer_one_by_one(a, records)
    b = ProducerStateTable(100, 10**9)
    for lo in range(0, len(records), 5000):
        chunk = records[lo : lo + 5000]
        res = b.offer_batch(pa.array([h for h, _ in chunk]), np.arange(lo, lo + len(chunk)))
        assert not res.released
        assert (res.log_order >= 0).all()
        for row, v in enumerate(res.verdicts()):
            assert expected_final[lo + row] is v
        assert [lo + i for i in res.log_order.tolist()] == [
            x for x in expected_log if lo <= x < lo + len(chunk)
        ]
    assert a == b


@dataclass
class Chain:
    """A table's snapshot chain as the sink keeps it: a full snapshot, then a delta per batch."""

    table: ProducerStateTable
    full: bytes = b""
    deltas: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """Start a new chain with a full snapshot of the table as it is."""
        self.full, self.deltas = self.table.snapshot(), []

    def delta(self) -> None:
        """Add what changed since the chain's last snapshot."""
        self.deltas.append(self.table.snapshot_delta())

    def restored(self) -> ProducerStateTable:
        """The table the chain restores."""
        return ProducerStateTable.restore_chain(self.full, self.deltas)


@SETTINGS
@given(st.integers(0, 2**32), knobs_strategy, streams.table_args, st.integers(1, 6))
def test_snapshots_and_delta_chains_restore_the_live_table(
    seed: int, knobs: streams.StreamKnobs, args: Any, pieces: int
) -> None:
    stream = streams.make_stream(random.Random(seed), knobs)
    chain = Chain(ProducerStateTable(*args))
    table = chain.table
    step = max(1, len(stream) // pieces)
    for lo in range(0, len(stream), step):
        for i, (header, ts) in enumerate(stream[lo : lo + step]):
            table.offer_header(header, ts, ref=lo + i)
        chain.delta()
    restored = chain.restored()
    assert restored == table
    assert ProducerStateTable.restore(table.snapshot()) == table
    # The restored table keeps deciding like the original.
    probe = encode_pf(1, 0, 0)
    assert [d.verdict for d in restored.offer_header(probe, 10**9)] == [
        d.verdict for d in table.offer_header(probe, 10**9)
    ]


@SETTINGS
@given(*BATCHED_STREAMS, st.lists(st.booleans(), max_size=8))
def test_batch_path_with_delta_chains_restores_the_live_table(
    seed: int, knobs: streams.StreamKnobs, args: Any, cuts: list[int], fulls: list[bool]
) -> None:
    # What the Spark sink does: offer_batch per micro-batch, then a delta (or, now and then, a
    # full snapshot that starts a new chain), restore_chain on the next batch.
    stream = streams.make_stream(random.Random(seed), knobs)
    chain = Chain(ProducerStateTable(*args))
    table = chain.table
    for i, (start, end, headers, stamps) in enumerate(streams.batches(stream, cuts)):
        table.offer_batch(headers, np.array(stamps, dtype=np.int64), refs=list(range(start, end)))
        if i < len(fulls) and fulls[i]:
            chain.restart()
        else:
            chain.delta()
        assert chain.restored() == table


@SETTINGS
@given(st.integers(0, 2**32), knobs_strategy, st.data())
def test_damaged_snapshots_raise_corrupt_snapshot_or_restore_identically(
    seed: int, knobs: streams.StreamKnobs, data: st.DataObject
) -> None:
    table = ProducerStateTable(6, 500, 3)
    for i, (header, ts) in enumerate(streams.make_stream(random.Random(seed), knobs)):
        table.offer_header(header, ts, ref=i)
    snap = bytearray(table.snapshot())
    mode = data.draw(st.sampled_from(["flip", "truncate", "extend", "garbage"]))
    if mode == "flip":
        pos = data.draw(st.integers(0, len(snap) - 1))
        snap[pos] ^= data.draw(st.integers(1, 255))
    elif mode == "truncate":
        snap = snap[: data.draw(st.integers(0, len(snap) - 1))]
    elif mode == "extend":
        snap += data.draw(st.binary(min_size=1, max_size=8))
    else:
        snap = bytearray(data.draw(st.binary(max_size=64)))
    try:
        restored = ProducerStateTable.restore(bytes(snap))
    except CorruptSnapshot:
        return
    assert restored == table


def _full_table() -> ProducerStateTable:
    """Three producers in a table of three, and one record of pid 1 held (seq 2 waits for 1)."""
    table = ProducerStateTable(capacity=3, lifetime_ms=1000, reorder_window=5)
    for pid in (1, 2, 3):
        table.offer(pid, 0, 0, 0)
    table.offer(1, 0, 2, 0, ref=7)
    return table


def _put(row: Any, key: Any, value: Any) -> None:
    row[key] = value


def _with_holes(payload: dict[str, Any], holes: list[list[int]]) -> None:
    payload["entries"][1][3] = 1000  # pid 2's highwater, above every hole
    payload["entries"][1][5] = holes


Corruption = Callable[[dict[str, Any]], None]
IMPOSSIBLE_CONTENT: list[Any] = [
    pytest.param(lambda p: _put(p["entries"][0], 0, 0), "pid 0 is duplicated", id="entry-pid-0"),
    pytest.param(
        lambda p: _put(p["entries"][1], 1, p["entries"][0][1]),
        "not in creation order",
        id="two-entries-one-serial",
    ),
    pytest.param(
        lambda p: _put(p["entries"][1], 3, -2),
        "pid 2 has an invalid generation, highwater",
        id="highwater-below-minus-1",
    ),
    pytest.param(
        lambda p: _with_holes(p, [[3 * i, 3 * i + 1] for i in range(MAX_HOLES + 1)]),
        f"holes must be 1..{MAX_HOLES} ranges",
        id="one-hole-too-many",
    ),
    pytest.param(
        lambda p: _with_holes(p, [[1, 3], [3, 5]]), "sorted, disjoint", id="holes-share-a-seq"
    ),
    pytest.param(
        lambda p: _put(p, "serial", p["entries"][-1][1]),
        "serial counter is behind",
        id="serial-counter-at-the-last-entry",
    ),
    pytest.param(
        lambda p: _put(p["held"][0], 5, p["arrival"]),
        "held record 1/2 is inconsistent",
        id="held-arrival-at-the-arrival-counter",
    ),
    pytest.param(
        lambda p: _put(p, "pending", [[0, 1, 10, [0, 0, 0, 0, 0, None]]]),
        "waiting records of pid 0",
        id="waiting-records-of-pid-0",
    ),
]


@pytest.mark.parametrize(("corrupt", "message"), IMPOSSIBLE_CONTENT)
def test_each_field_restore_validates_corrupted_alone_is_corrupt_naming_it(
    corrupt: Corruption, message: str
) -> None:
    """The CRC catches damaged bytes; these snapshots are well formed (framed and checksummed
    afresh) but say something no table can hold: a bug in the writer, or a crafted file. Each
    field is changed alone, so the check that names it is the one that must refuse it."""
    table = _full_table()
    snap = table.snapshot()
    assert ProducerStateTable.restore(_frame(_unframe(snap, "full"))) == table
    payload = _unframe(snap, "full")
    corrupt(payload)
    with pytest.raises(CorruptSnapshot, match=re.escape(message)):
        ProducerStateTable.restore(_frame(payload))


def test_a_capacity_override_below_a_full_snapshot_is_the_callers_mistake() -> None:
    # Exactly full: 3 live entries in a table of 3. Too small an override is a ValueError the
    # caller can fix, not damage (an older snapshot would not help).
    snap = _full_table().snapshot()
    with pytest.raises(ValueError, match="capacity >= 3"):
        ProducerStateTable.restore(snap, capacity=2)


def test_delta_applied_to_the_wrong_base_is_corrupt() -> None:
    table = ProducerStateTable(4, 1000)
    full = table.snapshot()
    table.offer(1, 0, 0, 0)
    table.snapshot_delta()
    table.offer(1, 0, 1, 1)
    second = table.snapshot_delta()
    with pytest.raises(CorruptSnapshot, match="epoch"):
        ProducerStateTable.restore_chain(full, [second])


def test_unserialisable_held_refs_are_refused_clearly() -> None:
    table = ProducerStateTable(4, 1000)
    table.offer(1, 0, 0, 0)
    table.offer(1, 0, 2, 0, ref=object())
    with pytest.raises(ValueError, match="msgpack-serialisable"):
        table.snapshot()


def test_rebuild_replays_the_log_after_a_snapshot() -> None:
    table = ProducerStateTable(4, 1000)
    table.offer(1, 0, 0, 0)
    snap = table.snapshot()
    suffix = [(encode_pf(1, 0, 1), 5), (encode_pf(2, 3, 0), 6), (encode_pf(1, 1, 2, 1), 7)]
    for header, ts in suffix:
        table.offer_header(header, ts)
    assert rebuild(snap, suffix) == table
    assert rebuild(None, [(encode_pf(1, 0, 0), 0), *suffix], capacity=4, lifetime_ms=1000) == table
    with pytest.raises(ValueError, match="capacity"):
        rebuild(None, [])


@SETTINGS
@given(*BATCHED_STREAMS, st.lists(st.booleans(), max_size=9), st.floats(0, 0.5), st.data())
def test_state_is_a_function_of_the_committed_output(
    seed: int,
    knobs: streams.StreamKnobs,
    args: Any,
    cuts: list[int],
    flushes: list[bool],
    forge: float,
    data: st.DataObject,
) -> None:
    """DESIGN §4 amended: for any stream and batch cut, the state rebuilt from any older snapshot
    (or none) plus the committed records equals the live state, and decides the same from then on.

    The committed records of a batch are its input with the committed verdicts (rejects
    included); a replay takes ``FORGED`` verdicts as the certificates' proof.
    """

    capacity, lifetime, window = args
    rng = random.Random(seed)
    stream = streams.make_stream(rng, knobs)
    certs = streams.with_certs(rng, stream, forge)
    live = ProducerStateTable(capacity, lifetime, window, verifier=streams.FakeVerifier())
    snapshots: list[bytes | None] = [None]
    committed: list[tuple[list[Any], list[int], list[str], list[int], bool]] = []
    for i, (lo, hi, headers, stamps) in enumerate(streams.batches(stream, cuts)):
        res = live.offer_batch(
            headers, np.array(stamps, np.int64), list(range(lo, hi)), certs[lo:hi]
        )
        flush = i < len(flushes) and flushes[i]
        if flush:
            live.flush(live.clock)
        verdicts = [v.value for v in res.verdicts()]
        committed.append((headers, stamps, verdicts, list(range(lo, hi)), flush))
        snapshots.append(live.snapshot())
    k = data.draw(st.integers(0, len(committed)), label="rebuild from snapshot")
    rebuilt = streams.restored(snapshots[k], args)
    for headers, stamps, verdicts, refs, flush in committed[k:]:
        replay_batch(rebuilt, headers, stamps, verdicts, refs, flush)
    assert rebuilt == live
    rebuilt.verifier = streams.FakeVerifier()
    more = streams.make_stream(random.Random(seed + 1), knobs)
    more_certs = streams.with_certs(random.Random(seed + 2), more, forge)
    streams.decide_alike_after(live, rebuilt, more, more_certs)
    assert rebuilt == live
