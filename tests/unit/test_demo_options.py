"""`pidfence demo`'s options and exits: values that can never work are refused before anything
starts (exit 2), any failure is one stderr line (never a traceback, never 75), and a signal
exits 130/143. ``run_demo`` is replaced here: no process is started."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.demo import BadDemoOption, DemoConfig, Fault
from pidfence.demo.config import PROCESS_FAULTS, zombie_can_pause
from pidfence.demo.runner import Stopped
from pidfence.services.process import ServiceFailed


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"produce_seconds": 0.0}, "--produce-seconds"),
        ({"produce_seconds": -1.0}, "--produce-seconds"),
        ({"produce_seconds": float("nan")}, "--produce-seconds"),
        ({"lease_lifetime_s": 0.0}, "--lease-lifetime"),
        ({"copier_records": -1}, "--copier-records"),
        ({"copier_records": 0}, "copier fault"),
        # Producers roll at 3/4 of a lease: a run shorter than that never rolls over.
        ({"lease_lifetime_s": 40.0, "produce_seconds": 30.0}, "rollover"),
    ],
)
def test_config_refuses_values_that_can_never_work(options: dict[str, Any], named: str) -> None:
    with pytest.raises(BadDemoOption, match=named):
        DemoConfig(**options)


def test_copier_records_zero_is_fine_without_the_copier_fault() -> None:
    config = DemoConfig(copier_records=0, faults=PROCESS_FAULTS - {Fault.COPIER})
    assert config.copier_records == 0


def test_a_zombie_that_could_never_pause_is_refused() -> None:
    # 40 s leases over a 26 s run: the zombie pauses in the first fifth of a lease (0-8 s, then
    # 30-38 s) once 40 % of the run is done (10.4 s): never.
    assert not zombie_can_pause(40.0, 26.0)
    with pytest.raises(BadDemoOption, match="zombie fault can never strike"):
        DemoConfig(faults=frozenset({Fault.ZOMBIE, Fault.NET}), lease_lifetime_s=40.0)
    # Without short leases the zombie pauses at once: no constraint.
    assert DemoConfig(faults=frozenset({Fault.ZOMBIE}), lease_lifetime_s=40.0)


def test_the_defaults_and_the_tests_numbers_are_accepted() -> None:
    assert zombie_can_pause(20.0, 26.0)  # the defaults: a roll at 15 s, inside 10.4-26 s
    assert zombie_can_pause(12.0, 14.0)  # tests/fixtures/demo.py
    assert zombie_can_pause(60.0, 26.0)  # the first lease's window reaches 40 %
    DemoConfig()
    DemoConfig(lease_lifetime_s=12.0, produce_seconds=14.0, records=400, copier_records=300)
    DemoConfig(faults=frozenset(Fault), produce_seconds=20.0)


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["demo", *args])


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_produce_seconds_zero_exits_2_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[Any] = []
    monkeypatch.setattr("pidfence.demo.run_demo", lambda *a, **k: started.append(a))
    result = _invoke("--produce-seconds", "0", "--faults", "kill")
    assert result.exit_code == 2, result.output
    assert "--produce-seconds must be > 0" in _one_line(result.stderr)
    assert started == []


def _run_demo_raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def run_demo(config: Any, console: Any) -> Any:
        raise error

    monkeypatch.setattr("pidfence.demo.run_demo", run_demo)


class _Retriable(ServiceFailed):
    retriable = True


@pytest.mark.parametrize(
    ("error", "code", "text"),
    [
        # A rerun resets OUT and starts over: never 75.
        (_Retriable("Kafka went away"), 3, "Kafka went away"),
        (ServiceFailed("kafka did not start"), 3, "kafka did not start"),
        # Errors pidfence does not name: one line too, not a traceback.
        (TimeoutError("reading raw: partitions [0] incomplete"), 3, "TimeoutError: reading raw"),
        (RuntimeError("boom\nsecond line"), 3, "RuntimeError: boom"),
        (Stopped(signal.SIGTERM), 143, "stopped by SIGTERM"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_every_failure_is_one_line_and_a_documented_code(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, code: int, text: str
) -> None:
    _run_demo_raising(monkeypatch, error)
    result = _invoke("--faults", "none")
    assert result.exit_code == code, (result.output, result.exception)
    assert text in _one_line(result.stderr)


def test_help_promises_no_retriable_exit() -> None:
    result = _invoke("--help")
    assert result.exit_code == 0
    assert "75" not in result.output
    assert "143" in result.output


def test_an_out_that_holds_a_projects_folders_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log").write_text("mine\n")
    (tmp_path / "output").mkdir()
    result = _invoke("--faults", "none", "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert "no .pidfence-demo marker" in line and "logs, output" in line
    assert (tmp_path / "logs" / "app.log").read_text() == "mine\n"


def test_an_out_that_cannot_be_written_exits_3_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = _invoke("--faults", "none", "--out", str(blocker / "out"))
    assert result.exit_code == 3, (result.output, result.exception)
    assert "--out" in _one_line(result.stderr)
