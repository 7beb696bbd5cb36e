"""Issue 11 on real Kafka and Spark: lost state files, skewed clocks, re-runs and a second query.

* A crafted topic is read by two outputs; one loses its newest state files between two runs. Both
  commit identical logs and rejects, including a duplicate under the next generation without a
  FENCE, a record held across the cut and a zombie after it.
* A header-less record 40 minutes ahead with a 30-minute lifetime expires nobody: every record
  of the live producer is appended.
* Spark re-runs a committed batch (its commit log entry is gone, as when the driver dies between
  the manifest and the commit log) with different options: the committed files stay byte-identical.
* A second query on the same output path fails at start and leaves the first one's files alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink.errors import OutputOwnedError
from pidfence.spark_sink.manifest import part_name
from pidfence.spark_sink.state_files import STATE
from pidfence.spark_sink.storage import Store
from pidfence.wire import FLAG_FENCE, encode_pf
from tests.integration.conftest import SinkOver, produce_labelled
from tests.integration.test_sink import Rec, labels, own_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

F = FLAG_FENCE

#: Run 1: x3 waits for x2 past the end of the run; y's generation 1 re-sends y0 without a FENCE
#: (a DUPLICATE, which must not move y's generation).
CUT1 = [
    Rec("x0", 0, (10, 4, 0)),
    Rec("x1", 0, (10, 4, 1)),
    Rec("x3-held", 0, (10, 4, 3)),
    Rec("y0", 0, (11, 0, 0)),
    Rec("y0-dup-next-gen", 0, (11, 1, 0)),
    Rec("z0", 1, (12, 0, 0)),
    Rec("z1", 1, (12, 0, 1)),
]
#: Run 2: x2 releases the held x3; x's generation 5 fences; the zombie of generation 4 follows.
CUT2 = [
    Rec("y1", 0, (11, 0, 1)),
    Rec("x2", 0, (10, 4, 2)),
    Rec("x-fence", 0, (10, 5, 4, F)),
    Rec("x4-zombie", 0, (10, 4, 4)),
    Rec("x4", 0, (10, 5, 4)),
    Rec("y1-dup-next-gen", 0, (11, 1, 1)),
    Rec("y2", 0, (11, 0, 2)),
    Rec("z1-dup", 1, (12, 0, 1)),
    Rec("z2", 1, (12, 0, 2)),
]
LOG = {
    0: ["x0", "x1", "y0", "y1", "x2", "x3-held", "x4", "y2"],
    1: ["z0", "z1", "z2"],
}
REJECTS = {
    "y0-dup-next-gen": "DUPLICATE",
    "x-fence": "FENCE",
    "x4-zombie": "FENCED",
    "y1-dup-next-gen": "DUPLICATE",
    "z1-dup": "DUPLICATE",
}


def lose_newest_state_files(output: Path, topic: str) -> list[str]:
    """Delete the newest state file of every partition; returns what was deleted."""
    store = Store.at(str(own_root(output)))
    gone = []
    for partition in (0, 1):
        folder = store.join(STATE, part_name(topic, partition))
        names = store.list(folder)
        assert names, f"no state files for partition {partition}"
        store.delete(f"{folder}/{names[-1]}")
        gone.append(names[-1])
    return gone


def by_partition(table: Any) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for p, label in zip(table.column("partition").to_pylist(), labels(table), strict=True):
        out.setdefault(p, []).append(label)
    return out


def test_two_outputs_one_losing_its_newest_state_files_commit_identical_output(
    sink_over: Callable[..., SinkOver], tmp_path: Path
) -> None:
    sink = sink_over()
    a, b = tmp_path / "a", tmp_path / "b"
    sink.send(CUT1)
    for out in (a, b):
        sink.run(out)
    # x3 is held across the cut: neither in the log nor in the rejects yet.
    assert "x3-held" not in labels(read_log(str(a))) + labels(read_rejects(str(a)))
    lose_newest_state_files(b, sink.topic)

    sink.send(CUT2)
    for out in (a, b):
        sink.run(out)

    log_a, log_b = read_log(str(a)), read_log(str(b))
    rej_a, rej_b = read_rejects(str(a)), read_rejects(str(b))
    assert log_b.equals(log_a)
    assert rej_b.equals(rej_a)
    assert by_partition(log_a) == LOG
    assert dict(zip(labels(rej_a), rej_a.column("verdict").to_pylist(), strict=True)) == REJECTS
    assert log_a.column("log_offset").to_pylist() == [*range(8), *range(3)]
    # And the output after the loss equals a third output that read everything in one batch.
    c = tmp_path / "c"
    sink.run(c)
    assert read_log(str(c)).equals(log_a)
    assert read_rejects(str(c)).equals(rej_a)


def produce_at(bootstrap: str, topic: str, recs: list[tuple[str, bytes | None, int]]) -> None:
    """Produce (label, pf header or None, timestamp ms) to partition 0, in order."""
    produce_labelled(
        bootstrap,
        topic,
        [(label, None if pf is None else [("pf", pf)], ts) for label, pf, ts in recs],
    )


def test_a_header_less_record_40_minutes_ahead_expires_nobody(
    sink_over: Callable[..., SinkOver],
) -> None:
    sink = sink_over(partitions=1, lifetime="30m")
    now = int(time.time() * 1000)
    minute = 60_000
    recs = [
        ("p0", encode_pf(20, 3, 0), now),
        ("ahead", None, now + 40 * minute),  # Kafka accepts CreateTime up to 1 h ahead
        ("p1", encode_pf(20, 3, 1), now + 1),
        ("p2", encode_pf(20, 3, 2), now + 2),
    ]
    produce_at(sink.bootstrap, sink.topic, recs[:2])
    sink.run()
    produce_at(sink.bootstrap, sink.topic, recs[2:])
    sink.run()
    assert labels(read_log(str(sink.out))) == ["p0", "ahead", "p1", "p2"]
    assert read_rejects(str(sink.out)).num_rows == 0


def _files(root: Path) -> dict[str, bytes]:
    """Every file of the output but the sink instances' claims (each run takes one)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and "_claims" not in p.parts)
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_a_committed_batch_re_run_with_other_options_changes_no_byte(
    sink_over: Callable[..., SinkOver],
) -> None:
    sink = sink_over()
    out, ckpt = sink.out, sink.ckpt
    for cut in (CUT1, CUT2):
        sink.send(cut)
        sink.run()
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    before = _files(out)
    # The driver "died" after the manifest of the last batch and before Spark's commit log.
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum sidecar
    # The re-run has options that would decide differently (one producer per partition, no
    # reordering); the batch is committed, so it writes nothing.
    sink.run(capacity="1", reorderWindow="0")
    assert (ckpt / "commits" / str(last)).exists()
    assert _files(out) == before


def test_a_second_query_on_the_output_fails_at_start_and_deletes_nothing(
    sink_over: Callable[..., SinkOver], tmp_path: Path
) -> None:
    sink = sink_over()
    sink.send(CUT1)
    sink.run()
    before = _files(sink.out)
    with pytest.raises(OutputOwnedError, match="belongs to streaming query") as info:
        sink.run(sink.out, tmp_path / "ckpt-2")
    assert not info.value.retriable
    assert _files(sink.out) == before
    # The owner restarted from its own checkpoint takes over as usual.
    sink.run()
    assert _files(sink.out) == before
