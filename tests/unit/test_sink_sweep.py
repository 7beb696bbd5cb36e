"""The sweep of the sink's own files (``sink vacuum``'s bookkeeping part) on a small aged output:
it deletes what nothing reads and keeps everything a reader, a rebuild or a newer instance needs.
The long run over hundreds of batches is tests/integration/test_sink_sweep.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pidfence.spark_sink import read_written
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.claims import claim_output, new_tag
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.positions import INDEX, INDEX_EVERY
from pidfence.spark_sink.segments import LISTS, listing
from pidfence.spark_sink.storage import FileStat, Store, batch_name
from pidfence.spark_sink.sweep import sweep
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.unit.test_sink_process import kafka_rows, make_stream, micro_batches

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "4"}
QUERY = "0f1e2d3c-sweep"
#: Two folds (at batches 64 and 128) and two indexes; partition 0 is read in batches 0..3 only.
BATCHES = 2 * INDEX_EVERY + 2
IDLE_AFTER = 4
#: A batch that is folded and that no partition's position names.
FOLDED_BATCH = 5


@pytest.fixture(scope="module")
def aged_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """An output whose partition 0 went idle long ago (its position names a folded batch's
    file), and the epoch of the instance that wrote it."""
    path = tmp_path_factory.mktemp("aged")
    claim = claim_output(Output.reading(str(path)).own, lapse=3600.0)
    assert claim is not None
    options = {"path": str(path), "retainBatches": "1", "epoch": str(claim.epoch), **SETTINGS}
    w = PidfenceStreamWriter(SinkOptions.parse(options), QUERY)
    idle = micro_batches(make_stream(1, 40), 10)
    busy = micro_batches(make_stream(2, 5 * BATCHES), 5)
    with pytest.MonkeyPatch.context() as monkeypatch:
        for b in range(BATCHES):
            monkeypatch.setattr(writer_mod, "_task_context", lambda b=b: (b, 0, QUERY))
            rows = [kafka_rows(busy[b], partition=1)]
            if b < IDLE_AFTER:
                rows.append(kafka_rows(idle[b], partition=0))
            w.commit([w.write(iter(pa.concat_tables(rows).to_batches()))], b)
    return path, claim.epoch


@pytest.fixture
def aged(aged_template: tuple[Path, int], tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A fresh copy of the aged output for one test to sweep."""
    template, epoch = aged_template
    path = tmp_path / "out"
    shutil.copytree(template, path)
    yield path, epoch


def _own_files(path: Path) -> set[str]:
    own = path / OWN_DIR
    return {str(p.relative_to(own)) for p in own.rglob("*") if p.is_file()}


def _decided(path: Path, batch: int) -> set[str]:
    return {rel for rel in _own_files(path) if rel.startswith(f"_decided/{batch_name(batch)}/")}


def _copy_into(path: Path, rel: str, source: str) -> str:
    """A file the sink may leave behind (a crash, a zombie), as a copy of one of its own."""
    target = path / OWN_DIR / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path / OWN_DIR / source, target)
    return rel


def test_sweep_deletes_leftovers_and_keeps_what_readers_and_newer_instances_need(
    aged: tuple[Path, int],
) -> None:
    path, epoch = aged
    idle_file = next(iter(_decided(path, IDLE_AFTER - 1)))  # partition 0's position names it
    unfolded = _decided(path, BATCHES - 2) | _decided(path, BATCHES - 1)
    assert unfolded
    zombie, older, newer = (
        _copy_into(path, f"_decided/{batch_name(FOLDED_BATCH)}/t~1.{new_tag(e)}.parquet", idle_file)
        for e in (epoch, epoch - 1, epoch + 1)
    )
    kept_index, stale_index = (f"{INDEX}/{batch_name(n)}.json" for n in (INDEX_EVERY, 0))
    _copy_into(path, stale_index, kept_index)  # a crash between an index and its clean-up
    own = Output.reading(str(path)).own
    assert int(own.read(own.join(INDEX, "latest"))) == 2 * INDEX_EVERY
    newest_list = listing(own)
    written = read_written(str(path))
    before = _own_files(path)

    gone = sweep(str(path), min_age_s=0)

    after = _own_files(path)
    assert after == before - set(gone)
    assert {zombie, older, stale_index} <= set(gone)
    assert newer in after, "a file of an instance that claimed the output since was deleted"
    assert idle_file in after, "the sweep deleted a file an idle partition's position names"
    assert unfolded <= after, "the sweep deleted files of batches not folded yet"
    assert kept_index in after, "the sweep deleted one of the two newest indexes"
    assert {rel for rel in after if rel.startswith(LISTS + "/")}, "no list of segments is left"
    assert listing(Output.reading(str(path)).own) == newest_list
    assert read_written(str(path)) == written


def test_sweep_leaves_young_files_even_on_a_store_that_keeps_no_times(
    aged: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, epoch = aged
    zombie = _copy_into(
        path,
        f"_decided/{batch_name(FOLDED_BATCH)}/t~1.{new_tag(epoch)}.parquet",
        next(iter(_decided(path, IDLE_AFTER - 1))),
    )
    assert zombie in sweep(str(path), dry_run=True, min_age_s=0)
    files = Store.files

    def without_times(store: Store, root: str) -> Iterator[tuple[str, FileStat]]:
        for rel, stat in files(store, root):
            yield rel, FileStat(stat.size, 0)  # 0: the store does not say

    monkeypatch.setattr(Store, "files", without_times)
    before = _own_files(path)
    assert sweep(str(path)) == []
    assert _own_files(path) == before
