"""Gaps and late starts through the sink's writer (no Spark): reported, committed, replayed.

The lease servers are faked here (a ``describe`` from a dict): adoption asks them, and a batch
records their answers, so a rebuild decides the same whatever they answer later.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from pidfence.broker_plugin import ProducerStateTable
from pidfence.spark_sink import read_gaps, read_log, read_rejects
from pidfence.spark_sink.authority import BatchAuthority
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.gaps import GapReport, unread_offsets
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.partition_batch import process_partition
from pidfence.spark_sink.state import PartitionState
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.wire import PidState, PidStatus, encode_pf
from tests.unit.test_sink_process import Record, commit_batches, kafka_rows

#: Batches here start above offset 0 on purpose (a trimmed head, a late start): say so.
SETTINGS = {
    "capacity": "64",
    "lifetime": "10000",
    "reorderWindow": "3",
    "compactEvery": "1",
    "startingOffsets": "latest",
}
QUERY = "0f1e2d3c-gaps-query"


def _producer(pid: int, seqs: list[int], first_offset: int, ts: int = 1_000) -> list[Record]:
    return [(first_offset + i, encode_pf(pid, 2, s), ts + i) for i, s in enumerate(seqs)]


class FakeLeases:
    """``LeaseClient.describe`` from a dict: pid -> generation (live for a day); others unknown."""

    def __init__(self, generations: dict[int, int]) -> None:
        self.generations = generations
        self.asked: list[int] = []

    def describe(self, pid: int) -> PidStatus:
        self.asked.append(pid)
        if pid not in self.generations:
            return PidStatus.unknown(pid)
        return PidStatus(pid, PidState.LIVE, self.generations[pid], 86_400_000)

    def close(self) -> None:
        pass


def _run(
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    batches: list[list[Record]],
    start: int = 0,
    leases: FakeLeases | None = None,
    **extra: str,
) -> None:
    servers = {} if leases is None else {"leaseServer": "127.0.0.1:1"}
    monkeypatch.setattr(SinkOptions, "lease_client", lambda self: leases)
    writer = PidfenceStreamWriter(
        SinkOptions.parse({"path": str(path), **SETTINGS, **servers, **extra})
    )
    commit_batches(monkeypatch, writer, batches, start, query=QUERY)


def test_unread_offsets() -> None:
    assert unread_offsets(0, None) is None
    assert unread_offsets(50, None) == GapReport("offsets", offset_after=50)
    assert unread_offsets(11, 10) is None
    assert unread_offsets(20, 10) == GapReport("offsets", offset_before=10, offset_after=20)


def test_gaps_read_as_the_offsets_and_seqs_that_are_missing() -> None:
    assert GapReport("offsets", offset_before=10, offset_after=20).human() == (
        "offsets 11..19 not read"
    )
    assert GapReport("offsets", offset_after=50).human() == "offsets 0..49 not read"
    assert GapReport("lost", 7, 2, 50, 52, 49, 53).human() == "pid 7 gen 2: seq 50..52 lost"


def test_a_first_read_above_offset_zero_adopts_running_producers() -> None:
    """Retention trimmed offsets 0-49 (seqs 0-49) before the sink first read the partition."""
    records = _producer(7, list(range(50, 200)), first_offset=50)
    st = PartitionState(ProducerStateTable(64, 10_000, 3, resolve_gaps=True))
    leases = FakeLeases({7: 2})
    out = process_partition(kafka_rows(records[:60]), "t", 0, st, authority=BatchAuthority(leases))
    assert out.log.num_rows == 60 and out.rejects.num_rows == 0
    assert out.horizon_ms == 1_000
    assert out.answers == {"7": [7, "live", 2, 86_400_000]} and leases.asked == [7]
    assert out.gaps == [
        GapReport("offsets", offset_after=50),
        GapReport("head", 7, 2, 0, 49, None, 50),
    ]
    out = process_partition(kafka_rows(records[60:]), "t", 0, st)
    assert out.log.num_rows == 90 and out.gaps == [] and out.horizon_ms is None


def test_a_batch_asks_about_each_pid_once_and_records_that_answer() -> None:
    leases = FakeLeases({7: 2})
    authority = BatchAuthority(leases)
    first = authority(7)
    leases.generations[7] = 3  # the lease servers' answer changes while the batch runs
    assert authority(7) == first
    assert authority(8) == PidStatus.unknown(8)
    assert leases.asked == [7, 8]
    assert authority.recorded() == {
        "7": [7, "live", 2, 86_400_000],
        "8": [8, "unknown", -1, 0],
    }


def test_without_lease_servers_nothing_is_adopted() -> None:
    records = _producer(7, list(range(50, 60)), first_offset=50)
    st = PartitionState(ProducerStateTable(64, 10_000, 3, resolve_gaps=True))
    out = process_partition(kafka_rows(records), "t", 0, st)
    assert out.log.num_rows == 0
    assert set(out.rejects.column("verdict").to_pylist()) == {"UNKNOWN_PID"}
    assert out.answers is None


def test_a_horizon_opens_no_later_than_the_clock_plus_the_grace() -> None:
    """A first record stamped a year ahead cannot keep adoption open for a year."""
    year = 365 * 86_400_000
    records = [(50, encode_pf(7, 2, 50), 1_000 + year)]
    st = PartitionState(ProducerStateTable(64, 10_000, 3, grace_ms=500, resolve_gaps=True))
    out = process_partition(kafka_rows(records), "t", 0, st, now_ms=1_000)
    assert out.horizon_ms == 1_500


def test_a_lost_record_is_one_gap_with_the_offsets_around_it() -> None:
    seqs = [*range(50), *range(51, 150)]
    st = PartitionState(ProducerStateTable(64, 10_000, 3, resolve_gaps=True))
    out = process_partition(kafka_rows(_producer(7, seqs, 0)), "t", 0, st)
    assert out.log.num_rows == 149
    assert out.gaps == [GapReport("lost", 7, 2, 50, 50, 49, 50)]


def test_the_record_before_a_gap_is_the_one_appended_not_its_duplicate() -> None:
    seqs = [*range(50), 49, *range(51, 150)]  # seq 49 resent at offset 50
    st = PartitionState(ProducerStateTable(64, 10_000, 3, resolve_gaps=True))
    out = process_partition(kafka_rows(_producer(7, seqs, 0)), "t", 0, st)
    assert out.rejects.column("verdict").to_pylist() == ["DUPLICATE"]
    assert out.gaps == [GapReport("lost", 7, 2, 50, 50, 49, 51)]


def test_gaps_and_horizons_are_committed_and_survive_losing_every_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 0 starts at offset 20 (a trimmed head), batch 1 loses a record, batch 2 skips
    offsets (retention during downtime); every state file is then deleted and a fourth batch
    decides exactly as a run that kept them."""
    p7 = _producer(7, list(range(20, 40)), first_offset=20)
    p8 = _producer(8, [*range(0, 10), *range(11, 30)], first_offset=40, ts=1_100)
    p9 = _producer(9, list(range(300, 310)), first_offset=100, ts=1_200)
    later = [
        *_producer(7, list(range(40, 45)), 110, ts=1_300),
        *_producer(9, [310, 311, 312], 115, ts=1_310),
    ]
    batches = [p7, p8, p9, later]
    kept, lost = tmp_path / "kept", tmp_path / "lost"
    _run(monkeypatch, kept, batches, leases=FakeLeases({7: 2, 8: 2, 9: 2}))
    _run(monkeypatch, lost, batches[:3], leases=FakeLeases({7: 2, 8: 2, 9: 2}))
    shutil.rmtree(lost / OWN_DIR / "_state")
    # The lease servers have forgotten every pid since, and resolveGaps was turned off: the
    # rebuild replays the answers and settings the batches recorded; the new batch runs with
    # today's.
    _run(monkeypatch, lost, batches[3:], start=3, leases=FakeLeases({}), resolveGaps="false")
    for path in (kept, lost):
        log = read_log(str(path))
        assert log.num_rows == 20 + 29 + 10 + 5 + 3
        assert read_rejects(str(path)).num_rows == 0
    assert read_log(str(kept)).equals(read_log(str(lost)))
    gaps = read_gaps(str(kept)).select(
        ["batch", "kind", "pid", "seq_first", "seq_last", "offset_before", "offset_after"]
    )
    assert gaps.to_pylist() == [
        {
            "batch": 0,
            "kind": "offsets",
            "pid": None,
            "seq_first": None,
            "seq_last": None,
            "offset_before": None,
            "offset_after": 20,
        },
        {
            "batch": 0,
            "kind": "head",
            "pid": 7,
            "seq_first": 0,
            "seq_last": 19,
            "offset_before": None,
            "offset_after": 20,
        },
        {
            "batch": 1,
            "kind": "lost",
            "pid": 8,
            "seq_first": 10,
            "seq_last": 10,
            "offset_before": 49,
            "offset_after": 50,
        },
        {
            "batch": 2,
            "kind": "offsets",
            "pid": None,
            "seq_first": None,
            "seq_last": None,
            "offset_before": 68,
            "offset_after": 100,
        },
        {
            "batch": 2,
            "kind": "head",
            "pid": 9,
            "seq_first": 0,
            "seq_last": 299,
            "offset_before": None,
            "offset_after": 100,
        },
    ]
    assert read_gaps(str(lost)).equals(read_gaps(str(kept)))


def test_with_resolve_gaps_off_the_sink_keeps_the_proposals_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = [*range(10), *range(11, 30)]
    _run(monkeypatch, tmp_path, [_producer(8, seqs, 0)], resolveGaps="false")
    assert read_log(str(tmp_path)).num_rows == 10
    assert set(read_rejects(str(tmp_path)).column("verdict").to_pylist()) == {"OUT_OF_ORDER"}
    assert read_gaps(str(tmp_path)).num_rows == 0


def test_read_gaps_of_an_empty_output(tmp_path: Path) -> None:
    assert read_gaps(str(tmp_path)).num_rows == 0
    assert isinstance(read_gaps(str(tmp_path)), pa.Table)
