"""What the CLI prints and decides without servers: batch lines, demo bars, preflight arithmetic,
exit codes."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from pidfence.cli.exits import (
    EXIT_BY_ERROR,
    EXIT_RETRIABLE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    code_of,
    exit_cleanly,
)
from pidfence.cli.preflight import (
    KafkaUnreachable,
    PathUnusable,
    TopicMissing,
    TopicReport,
    ZooKeeperUnreachable,
    check_kafka,
    check_writable,
)
from pidfence.demo.procs import Worker
from pidfence.demo.progress import role_line
from pidfence.spark_sink import BatchLine, SinkOptionError
from pidfence.spark_sink.delta.errors import RestoredPastSink
from pidfence.spark_sink.failure import SparkQueryFailed
from pidfence.spark_sink.preflight import check_apart, records_to_read
from pidfence.spark_sink.spark_checkpoint import start_offsets
from pidfence.verify import VerifyInputError
from pidfence.wire import PidfenceError


def test_batch_line_is_human() -> None:
    line = BatchLine(12, 98_012, 97_500, {"FENCED": 12, "DUPLICATE": 500}, 3_400, 1.94)
    assert line.human() == (
        "batch 12: 98,012 in → 97,500 appended, 512 dropped (DUPLICATE 500, FENCED 12), "
        "lag 3,400, 1.9 s"
    )


def test_batch_line_without_drops_lag_or_time() -> None:
    assert BatchLine(0, 10, 10, {}, None).human() == "batch 0: 10 in → 10 appended, 0 dropped"
    assert BatchLine(1, 3, 2, {"FENCE": 1, "DUPLICATE": 0}, 0, None).human() == (
        "batch 1: 3 in → 2 appended, 1 dropped (FENCE 1), lag 0"
    )


def _ledger(path: Path, events: list[str], fences: int = 0) -> Path:
    lines = [json.dumps({"fence": False, "digest": e, "event": e}) for e in events]
    lines += [json.dumps({"fence": True, "digest": "f"}) for _ in range(fences)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _worker(tmp_path: Path, name: str, events: list[str], fate: str | None = None) -> Worker:
    worker = Worker(name, ["true"], tmp_path, ledger=_ledger(tmp_path / f"{name}.jsonl", events))
    worker.fate = fate
    return worker


def test_role_line_counts_distinct_events_and_shows_extras(tmp_path: Path) -> None:
    first = _worker(tmp_path, "p0", [f"e{i}" for i in range(60)], fate="killed")
    # The restart re-sends e50..e59 (after the checkpoint), then writes the rest.
    second = _worker(tmp_path, "p0.r1", [f"e{i}" for i in range(50, 100)], fate=None)
    second.exit_code = lambda: 0  # type: ignore[method-assign]
    line = role_line([first, second])
    assert (line.distinct, line.resent, line.zombie) == (100, 10, 0)
    assert line.note() == "+ 10 resent · p0 killed → p0.r1 done"
    assert not line.running


def test_role_line_separates_zombie_writes(tmp_path: Path) -> None:
    zombie = _worker(tmp_path, "p1", [f"e{i}" for i in range(80)], fate="fenced")
    replacement = _worker(tmp_path, "p1.r1", [f"e{i}" for i in range(40, 100)])
    replacement.exit_code = lambda: 0  # type: ignore[method-assign]
    line = role_line([zombie, replacement], zombie_wrote=30)
    assert (line.distinct, line.resent, line.zombie) == (100, 10, 30)
    assert line.note() == "+ 10 resent, + 30 zombie · p1 fenced → p1.r1 done"


def test_one_instance_role_shows_its_state_alone(tmp_path: Path) -> None:
    worker = _worker(tmp_path, "p2", ["a", "b", "a"])
    worker.exit_code = lambda: 0  # type: ignore[method-assign]
    assert role_line([worker]).note() == "+ 1 resent · done"
    assert _worker(tmp_path, "p3", []).final_state() == "not started"


def test_no_pf_warning_only_for_a_non_empty_sample_without_any_header() -> None:
    assert TopicReport(sampled=0, with_pf=0).no_pf_warning is None
    assert TopicReport(sampled=10, with_pf=1).no_pf_warning is None
    warning = TopicReport(sampled=10, with_pf=0).no_pf_warning
    assert warning is not None and "NON_IDEMPOTENT" in warning


def test_start_offsets_follow_the_last_committed_batch(tmp_path: Path) -> None:
    marks = {("t", 0): (5, 100), ("t", 1): (0, 50)}
    assert start_offsets(str(tmp_path), marks, "earliest") == {("t", 0): 5, ("t", 1): 0}
    assert start_offsets(str(tmp_path), marks, "latest") == {("t", 0): 100, ("t", 1): 50}
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    meta = '{"batchWatermarkMs":0}'
    (tmp_path / "offsets" / "0").write_text(f'v1\n{meta}\n{{"t":{{"0":40,"1":20}}}}\n')
    (tmp_path / "offsets" / "1").write_text(f'v1\n{meta}\n{{"t":{{"0":90,"1":45}}}}\n')
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")  # batch 1 planned, not committed
    starts = start_offsets(str(tmp_path), marks, "earliest")
    assert starts == {("t", 0): 40, ("t", 1): 20}
    assert records_to_read(marks, starts) == 60 + 30


@given(
    st.dictionaries(
        st.integers(0, 5),
        st.tuples(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 2000)),
        max_size=6,
    )
)
def test_records_to_read_is_never_negative_nor_above_the_topic(
    parts: dict[int, tuple[int, int, int]],
) -> None:
    marks = {("t", p): (min(a, b), max(a, b)) for p, (a, b, _) in parts.items()}
    starts = {("t", p): s for p, (_, _, s) in parts.items()}
    total = records_to_read(marks, starts)
    assert 0 <= total <= sum(high - low for low, high in marks.values())


def test_check_writable_refuses_a_file_and_creates_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(PathUnusable, match="is a file"):
        check_writable(str(tmp_path / "f"), "output")
    check_writable(str(tmp_path / "new" / "deep"), "checkpoint")
    assert (tmp_path / "new" / "deep").is_dir()
    assert list((tmp_path / "new" / "deep").iterdir()) == []  # the probe file is gone
    with pytest.raises(PathUnusable, match="not writable"):
        check_writable(str(tmp_path / "f" / "below"), "output")


@pytest.mark.parametrize(
    "error", [KafkaUnreachable, ZooKeeperUnreachable, TopicMissing, PathUnusable]
)
def test_a_failed_preflight_check_exits_3_as_a_rerun_meets_it_again(error: type) -> None:
    assert code_of(error("what failed; the fix")) == EXIT_UNAVAILABLE


class TopicWithoutPartitions:
    """A consumer whose metadata lists topic ``t`` with no partition (and no error)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions={})})

    def close(self) -> None:
        pass


def test_a_topic_without_partitions_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pidfence.cli.preflight.refused_everywhere", lambda servers: False)
    monkeypatch.setattr("confluent_kafka.Consumer", TopicWithoutPartitions)
    with pytest.raises(TopicMissing, match=r"topic 't' does not exist.*create it first"):
        check_kafka("127.0.0.1:9", ["t"], timeout_s=0.2)


@pytest.mark.parametrize(
    ("output", "checkpoint"),
    [
        ("out", "out"),
        ("out", "./out/"),
        ("out", "out/ckpt"),
        ("file://out", "out/ckpt"),
        ("s3://lake/out", "s3a://lake/out"),
        ("s3://lake/out/", "s3a://lake/out/ckpt"),
    ],
)
def test_a_checkpoint_at_or_inside_the_output_is_a_usage_error(
    output: str, checkpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SinkOptionError, match="next to it") as caught:
        check_apart(output, checkpoint)
    assert code_of(caught.value) == EXIT_USAGE


@pytest.mark.parametrize(
    ("output", "checkpoint"),
    [
        ("out", "out-ckpt"),
        ("out", "ckpt"),
        ("s3://lake/out", "s3a://lake/out-ckpt"),
        ("out/x", "out"),
    ],
)
def test_a_checkpoint_next_to_the_output_or_around_it_passes(
    output: str, checkpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    check_apart(output, checkpoint)
    check_apart(output, None)


def test_exit_code_of_an_error_follows_its_retriable_flag() -> None:
    class Soon(PidfenceError):
        retriable = True

    assert code_of(Soon()) == EXIT_RETRIABLE
    assert code_of(PidfenceError()) == EXIT_UNAVAILABLE


def test_the_exit_table_names_pidfence_errors_and_decides_by_the_most_derived_class() -> None:
    for name in EXIT_BY_ERROR:
        module, _, cls = name.rpartition(".")
        found = getattr(importlib.import_module(module), cls)
        assert issubclass(found, PidfenceError), name
    assert code_of(SinkOptionError("bad")) == EXIT_USAGE
    assert code_of(VerifyInputError("no ledger")) == EXIT_USAGE
    assert code_of(RestoredPastSink("restored")) == EXIT_UNAVAILABLE
    assert code_of(SparkQueryFailed("spark")) == EXIT_RETRIABLE
    assert code_of(ValueError("not ours")) == EXIT_UNAVAILABLE


def test_no_topic_asks_kafka_for_no_timestamp_type() -> None:
    # pidfence demo checks Kafka with no topic yet; describe_configs refuses an empty list.
    from pidfence.cli.preflight import _timestamp_types

    assert _timestamp_types("127.0.0.1:9", [], 0.1) == {}


def test_sink_help_offers_the_sink_options_and_no_legacy_or_format_flag() -> None:
    from typer.testing import CliRunner

    from pidfence.cli import app

    result = CliRunner().invoke(app, ["sink", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for flag in (
        "--lease-public-key",
        "--record-mac-secret",
        "--resolve-gaps",
        "--allow-data-loss",
    ):
        assert flag in result.output
    for gone in ("legacy", "--table-format", "migrate"):
        assert gone not in result.output


@pytest.mark.parametrize("master", ["bogus", "local[x]", "spark://", "locl[*]"])
def test_a_master_spark_cannot_parse_is_a_usage_error_before_any_jvm(
    master: str, tmp_path: Path
) -> None:
    """Spark's own refusal came as "Spark did not start", exit 75: a supervisor would rerun
    it forever."""
    from typer.testing import CliRunner

    from pidfence.cli import app

    argv = ["sink", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--master", master]
    argv += ["--output", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "not a Spark master URL" in result.output


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--lifetime-rollover", "1.5"), "ProducerConfigError"),
        (("--lease-public-key", "/nonexistent/lease.pem"), "KeyFileError"),
    ],
)
def test_produce_with_a_setting_that_cannot_work_is_a_usage_error(
    option: tuple[str, str], says: str
) -> None:
    """As the README's table says for a bad option (it was 3), before any server is asked."""
    from typer.testing import CliRunner

    from pidfence.cli import app

    argv = ["produce", "--bootstrap", "127.0.0.1:1", "--lease-server", "127.0.0.1:1"]
    result = CliRunner().invoke(app, [*argv, "--topic", "t", "--count", "1", *option])
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_an_error_escaping_a_command_is_its_first_line_and_its_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(typer.Exit) as info, exit_cleanly("sink"):
        raise TopicMissing(
            "topic 't' does not exist on Kafka at b:9092; create it first\n(details)"
        )
    assert info.value.exit_code == EXIT_UNAVAILABLE
    assert capsys.readouterr().err == (
        "pidfence sink: error: topic 't' does not exist on Kafka at b:9092; create it first\n"
    )
