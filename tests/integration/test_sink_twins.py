"""Two drivers on one output and one batch, at the code level (issue 45, point 4).

Each "driver" is a real :class:`PidfenceStreamWriter` over the real Delta tables on disk; the
tasks run in this process (Spark's task context stubbed). The race is played in one thread: the
second driver's ``commit()`` is paused at its ``before_manifest`` point while the first driver
commits the same batch whole, exactly the interleaving the issue describes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pidfence.demo.procs import pidfence_argv, sink_args
from pidfence.spark_sink import crash_points, read_log
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.claims import OutputFenced, claim_output
from pidfence.spark_sink.manifest import BatchManifest
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.state_files import decode_state, state_dir
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from tests.unit.test_sink_process import expected_log, kafka_rows, make_stream, micro_batches

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "2"}
QUERY = "0f1e2d3c-twin-query"


def _driver(path: Path, epoch: int = 0) -> PidfenceStreamWriter:
    return PidfenceStreamWriter(
        SinkOptions.parse({"path": str(path), "epoch": str(epoch), **SETTINGS}), QUERY
    )


def _task(
    monkeypatch: pytest.MonkeyPatch, w: PidfenceStreamWriter, batch: int, rows: pa.Table
) -> SinkCommitMessage:
    monkeypatch.setattr(writer_mod, "_task_context", lambda: (batch, 0, QUERY))
    return w.write(iter(rows.to_batches(max_chunksize=17)))


def _during_manifest(run: Callable[[], None]) -> None:
    """Run ``run`` once, the first time a driver reaches ``before_manifest``."""
    fired: list[bool] = []

    def hook(point: str, attempt: int) -> None:
        if point == "before_manifest" and not fired:
            fired.append(True)
            run()

    crash_points.install_hook(hook)


@pytest.fixture(autouse=True)
def _no_hook() -> object:
    yield None
    crash_points.install_hook(None)


def _named_files_exist(path: Path, manifest: BatchManifest) -> list[str]:
    output = Output.reading(str(path))
    missing = []
    for part in manifest.parts:
        for kind in ("log", "rejects", "held", "decided"):
            rel = part.files.of(kind)
            if rel is None:
                continue
            store = output.own if kind in ("held", "decided") else output.table(kind)
            if not store.exists(store.join(rel)):
                missing.append(f"{kind}: {rel}")
    return missing


def test_loser_of_a_batch_never_overwrites_or_deletes_the_winners_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driver B pauses before publishing batch 1; driver A commits batch 1 whole; B resumes.

    Before issue 45 B overwrote A's manifest after losing the Delta commit, then deleted its
    own files that the manifest now named, and A's clean-up by query prefix deleted B's: the
    committed manifest named files that were gone, and every later batch failed."""
    records = make_stream(21, 240)
    chunks = micro_batches(records, 60)
    a, b = _driver(tmp_path), _driver(tmp_path)
    a.commit([_task(monkeypatch, a, 0, kafka_rows(chunks[0]))], 0)
    from_a = _task(monkeypatch, a, 1, kafka_rows(chunks[1]))
    from_b = _task(monkeypatch, b, 1, kafka_rows(chunks[1]))
    _during_manifest(lambda: a.commit([from_a], 1))
    b.commit([from_b], 1)
    manifest = Output.reading(str(tmp_path)).committed(1)
    assert manifest is not None
    assert _named_files_exist(tmp_path, manifest) == []
    # The state file the committed manifest names is the committing attempt's own.
    output = Output.reading(str(tmp_path))
    for part in manifest.parts:
        state = decode_state(output.own.read(f"{state_dir(output.own, 't', 0)}/{part.state}"))
        assert state.tag == part.tag
    # The next batches continue, exactly.
    for batch in (2, 3):
        a.commit([_task(monkeypatch, a, batch, kafka_rows(chunks[batch]))], batch)
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected_log(records)


def test_twins_state_files_do_not_overwrite_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both drivers run batch 1's task; each attempt's state file survives the other's."""
    chunks = micro_batches(make_stream(22, 120), 60)
    a, b = _driver(tmp_path), _driver(tmp_path)
    a.commit([_task(monkeypatch, a, 0, kafka_rows(chunks[0]))], 0)
    from_a = _task(monkeypatch, a, 1, kafka_rows(chunks[1]))
    from_b = _task(monkeypatch, b, 1, kafka_rows(chunks[1]))  # written second
    a.commit([from_a], 1)
    output = Output.reading(str(tmp_path))
    manifest = output.committed(1)
    assert manifest is not None and manifest.parts[0].tag == from_a.tag
    state = decode_state(
        output.own.read(f"{state_dir(output.own, 't', 0)}/{manifest.parts[0].state}")
    )
    assert state.tag == from_a.tag, "the loser's state file replaced the winner's"
    b.commit([from_b], 1)


def _take_over(path: Path) -> int:
    """Claim the output as a new instance would once the current claim lapsed."""
    ticks = iter(range(0, 10_000, 100))
    own = Output.reading(str(path)).own
    claim = claim_output(own, lapse=1.0, clock=lambda: float(next(ticks)))
    assert claim is not None
    return claim.epoch


def test_a_fenced_driver_commits_nothing_and_deletes_nothing_of_its_successor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A (epoch 1) stalls past its claim; B takes the output over (epoch 2). A's commit and its
    clean-up of a failed batch are refused or leave B's files alone; B continues exactly."""
    records = make_stream(23, 240)
    chunks = micro_batches(records, 60)
    first = _take_over(tmp_path)
    a = _driver(tmp_path, first)
    a.commit([_task(monkeypatch, a, 0, kafka_rows(chunks[0]))], 0)
    from_a = _task(monkeypatch, a, 1, kafka_rows(chunks[1]))
    b = _driver(tmp_path, _take_over(tmp_path))
    from_b = _task(monkeypatch, b, 1, kafka_rows(chunks[1]))
    with pytest.raises(OutputFenced, match="took this output over"):
        a.commit([from_a], 1)
    assert Output.reading(str(tmp_path)).intent(1) is None
    a.abort([from_a], 1)  # the zombie cleans up its failed batch: B's files stay
    assert from_b.tag is not None
    assert [p for p in tmp_path.rglob(f"*{from_b.tag}*")], "the zombie deleted B's files"
    b.commit([from_b], 1)
    for batch in (2, 3):
        b.commit([_task(monkeypatch, b, batch, kafka_rows(chunks[batch]))], batch)
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected_log(records)
    manifest = Output.reading(str(tmp_path)).committed(3)
    assert manifest is not None and manifest.epoch == first + 1


def _produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + n):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i)
    assert producer.flush(30) == 0


def _wait_for(what: str, check: Callable[[], bool], seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.5)


def test_a_second_sink_on_the_same_output_waits_and_takes_over_when_the_first_stops(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    """Two ``pidfence sink`` processes, one output and checkpoint: the second never starts its
    query while the first runs (it says who holds the output), takes over when the first
    stops, and the output has every record once."""
    topic = new_topic(partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = pidfence_argv("sink", *sink_args(kafka.bootstrap, topic, out, ckpt), "--trigger", "0.5")
    argv += ["--master", "local[1]"]
    env = {**os.environ, "COLUMNS": "200"}
    logs = {name: (tmp_path / f"{name}.out").open("w") for name in ("first", "second")}

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv, stdout=logs[name], stderr=subprocess.STDOUT, env=env, text=True
        )

    def text(name: str) -> str:
        return (tmp_path / f"{name}.out").read_text()

    _produce(kafka.bootstrap, topic, 0, 200)
    first = start("first")
    second: subprocess.Popen[str] | None = None
    try:
        _wait_for("the first sink's batch 0", lambda: "batch 0:" in text("first"))
        second = start("second")
        _wait_for("the standby's line", lambda: "held by another sink instance" in text("second"))
        assert f"process {first.pid}" in text("second")
        _produce(kafka.bootstrap, topic, 200, 200)
        _wait_for("400 records", lambda: read_log(str(out)).num_rows == 400)
        assert first.poll() is None, text("first")
        assert "batch " not in text("second").replace("held by", "")
        first.send_signal(signal.SIGTERM)
        assert first.wait(120) == 0, text("first")
        _produce(kafka.bootstrap, topic, 400, 200)
        _wait_for(
            "the second sink's batch",
            lambda: re.search(r"^batch \d+:", text("second"), re.M) is not None,
        )
        _wait_for("600 records", lambda: read_log(str(out)).num_rows == 600)
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, text("second")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    log = read_log(str(out))
    keys = sorted(zip(log["partition"].to_pylist(), log["offset"].to_pylist(), strict=True))
    assert len(set(keys)) == len(keys) == 600
    # Each instance printed only the batches it committed.
    printed = [re.findall(r"^batch (\d+):", text(n), re.M) for n in ("first", "second")]
    assert not set(printed[0]) & set(printed[1]), printed
