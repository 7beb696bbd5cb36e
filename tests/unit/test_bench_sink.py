"""The sink benches' own checks, without Kafka or Spark: what each contender wrote is held
against what the raw topic holds, settings are refused before anything starts, and nothing is
left running when a start fails."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pidfence.benchkit import BadBenchSetting, load_bench

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def sink() -> Any:
    return load_bench("sink", BENCH_DIR)


def _contender(sink: Any, key: str, label: str, outputs: list[int]) -> Any:
    c = sink.contending
    extra = {"dropped": {"DUPLICATE": 5}, "forged_reasons": {}} if key == "pidfence" else {}
    return c.Contender(
        key,
        label,
        build=lambda *a: None,
        outcome=lambda *a: None,
        times=[2.0] * len(outputs),
        phases=[{}] * len(outputs),
        outputs=outputs,
        last=c.Outcome(outputs[-1], extra=extra),
    )


def test_a_sink_that_drops_records_fails_the_run_with_its_figures(
    sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink.contending, "delta_spark_jars", lambda: [])
    sent = {"fresh": 95, "resent": 5, "certified": 3}
    entries = [
        _contender(sink, "plain", "(a) Parquet", [100, 100]),
        _contender(sink, "noop", "(n) no-op", [100, 100]),
        # Drops a tenth of what it should keep in round 2, and would look faster for it.
        _contender(sink, "pidfence", "(c) pidfence sink", [95, 86]),
    ]
    chosen = sink.Settings(100, 2, False, 1000, frozenset({"plain", "noop", "pidfence"}))
    report = sink._report(sink.LOCAL, chosen, 1000, 0, 1.0, sent, entries, ("0", ["0"], "0"))
    assert report.failed == "(c) pidfence sink, round 2, wrote 86 rows, expected 95 (fresh)"
    assert len(report.rows) == 3  # the figures are still there
    assert report.notes[-1].startswith("FAILED: (c) pidfence sink, round 2")

    entries[2].outputs[1] = 95
    entries[0].outputs[0] = 101  # a sink that keeps all may not write more either
    report = sink._report(sink.LOCAL, chosen, 1000, 0, 1.0, sent, entries, ("0", ["0"], "0"))
    assert report.failed == "(a) Parquet, round 1, wrote 101 rows, expected 100 (every record)"


def test_an_unknown_contender_is_refused_before_kafka_starts(
    sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pidfence.services

    started: list[str] = []
    monkeypatch.setattr(pidfence.services, "KafkaCluster", lambda *a, **k: started.append("k"))
    monkeypatch.setenv("PIDFENCE_BENCH_CONTENDERS", "delta")
    with pytest.raises(BadBenchSetting, match="no contender delta"):
        sink.run_mode(sink.LOCAL, True, SimpleNamespace())
    monkeypatch.setenv("PIDFENCE_BENCH_CONTENDERS", "pidfence")
    monkeypatch.setenv("PIDFENCE_BENCH_WARMUP", "no")
    with pytest.raises(BadBenchSetting, match="PIDFENCE_BENCH_WARMUP"):
        sink.run_mode(sink.LOCAL, True, SimpleNamespace())
    assert started == []
    monkeypatch.setenv("PIDFENCE_BENCH_WARMUP", "0")
    chosen = sink.settings(quick=True)
    assert chosen.keys == {"plain", "noop", "pidfence"} and not chosen.warm_up


class _Kafka:
    stopped = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def start(self) -> _Kafka:
        return self

    def stop(self) -> None:
        _Kafka.stopped = True


def test_a_store_that_cannot_start_leaves_no_kafka_running(
    sink: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pidfence.services
    import pidfence.services.seaweedfs

    for name in ("CONTENDERS", "WARMUP", "RECORDS", "ROUNDS", "ARROW_BATCH"):
        monkeypatch.delenv(f"PIDFENCE_BENCH_{name}", raising=False)

    def no_weed(*args: Any) -> Any:
        raise FileNotFoundError("weed")

    monkeypatch.setattr(pidfence.services, "KafkaCluster", _Kafka)
    monkeypatch.setattr(pidfence.services.seaweedfs, "SeaweedFS", no_weed)
    monkeypatch.setattr(sink.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work"))
    progress = SimpleNamespace(add_task=lambda *a, **k: 0)
    with pytest.raises(FileNotFoundError, match="weed"):
        sink.run_mode(sink.S3, True, progress)
    assert _Kafka.stopped
    assert not (tmp_path / "work").exists()


def test_the_fresh_counts_are_what_the_fill_sends(tmp_path: Path) -> None:
    world = load_bench("_sink_world", BENCH_DIR)
    records = list(world._records(5_000, 3))
    counts = world.fresh_before(5_000, 4, seed=3)
    assert [len(c) - 1 for c in counts] == [sum(p % 4 == i for p, *_ in records) for i in range(4)]
    assert sum(c[-1] for c in counts) == sum(not resent for _, _, resent, _ in records)
    (tmp_path / "0.rows").write_text("7")
    (tmp_path / "1.rows").write_text("5")
    assert world.written_rows("pidfence_bench_noop", str(tmp_path)) == 12
    assert world.written_rows("pidfence", str(tmp_path / "none")) == 0  # no batch committed
    assert world.wrong_rows("(a)", 12, 12, "all") is None


def test_the_small_batches_bench_leaves_out_the_short_last_batch() -> None:
    small = load_bench("sink_small", BENCH_DIR)
    ms = list(range(small.WARM)) + [100] * 15 + [7]  # warm, measured, the short tail
    assert small.measured(ms, 15) == [100] * 15
    with pytest.raises(RuntimeError, match="ran 19 batches"):
        small.measured(ms[:19], 15)


class _Query:
    def __init__(self, batches: int, active: bool = True) -> None:
        self.recentProgress = [SimpleNamespace(numInputRows=5) for _ in range(batches)]
        self.isActive = active

    def exception(self) -> None:
        return None


def test_the_aged_bench_stops_waiting_when_the_topic_runs_out() -> None:
    aged = load_bench("sink_aged", BENCH_DIR)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(RuntimeError, match="no new batch for 5 s after 2 of 9"):
        aged.wait_batches(_Query(2), 9, stall_s=5, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(RuntimeError, match="stopped after 1 of 9"):
        aged.wait_batches(_Query(1, active=False), 9, clock=lambda: now[0], sleep=sleep)
    aged.wait_batches(_Query(9), 9, clock=lambda: now[0], sleep=sleep)


def test_the_aged_bench_checks_what_each_query_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pidfence.spark_sink.output

    aged = load_bench("sink_aged", BENCH_DIR)
    world = load_bench("_sink_world", BENCH_DIR)
    part = SimpleNamespace(partition=1, kafka_first=2, kafka_last=5)
    manifests = {3: [SimpleNamespace(parts=[part])]}
    reading = SimpleNamespace(manifests=lambda top: manifests[top])
    monkeypatch.setattr(pidfence.spark_sink.output.Output, "reading", lambda path: reading)
    # Partition 1's records at offsets 2..5: fresh, resent, fresh, fresh.
    fresh = [[0], [0, 1, 2, 3, 3, 4, 5]]
    rows = [10]
    fake = SimpleNamespace(written_rows=lambda fmt, out: rows[0], wrong_rows=world.wrong_rows)
    run = aged.Run(fake, tmp_path, fresh)
    rows[0] = 13
    assert aged.output_miss(run, (3, 10), "round 1: aged output") is None
    rows[0] = 12
    assert aged.output_miss(run, (3, 10), "round 1: aged output") == (
        "round 1: aged output wrote 2 rows, expected 3 (the fresh records its batches read)"
    )
