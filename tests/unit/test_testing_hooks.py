"""``pidfence.testing``'s hooks: the sink's fault hook, the Spark Python wrapper, mutations, the
supervisor and the network nemesis (driven with fakes and an injected clock)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from pidfence.services.process import ServiceFailed
from pidfence.spark_sink import crash_points
from pidfence.testing import (
    BadSinkFault,
    FaultKind,
    FaultPlan,
    Link,
    ManualClock,
    NetworkNemesis,
    SinkFaults,
    Supervisor,
    UnknownMutation,
    install_mutation,
    run_argv,
    step,
)
from pidfence.testing.network import LinkFaults
from pidfence.testing.sink_faults import HELD, RELEASE, InjectedFault, kill_group
from pidfence.testing.spark_python import python_wrapper


@pytest.fixture(autouse=True)
def _no_hook_left() -> object:
    yield
    crash_points.install_hook(None)


def test_without_a_hook_every_crash_point_is_a_no_op() -> None:
    for point in crash_points.POINTS:
        crash_points.crash_point(point, 0)


def test_the_hook_fails_first_attempts_and_leaves_retries_alone() -> None:
    SinkFaults(fail_first_attempt=True).install()
    with pytest.raises(InjectedFault, match="attempt 0"):
        crash_points.crash_point("task_start", 0)
    crash_points.crash_point("task_start", 1)
    crash_points.crash_point("after_write", 0)


def test_a_crash_needs_a_known_point_and_a_group() -> None:
    with pytest.raises(BadSinkFault, match="unknown crash point"):
        SinkFaults(crash_at="somewhere", group=1)
    with pytest.raises(BadSinkFault, match="process group"):
        SinkFaults(crash_at="after_write")
    given = SinkFaults(crash_at="after_write", group=123, fail_first_attempt=True)
    assert SinkFaults.from_json(given.to_json()) == given


def test_a_hold_keeps_the_first_arrival_until_released_and_lets_later_ones_pass(
    tmp_path: Path,
) -> None:
    with pytest.raises(BadSinkFault, match="folder"):
        SinkFaults(hold_at="before_manifest")
    given = SinkFaults(hold_at="before_manifest", hold_dir=str(tmp_path))
    assert SinkFaults.from_json(given.to_json()) == given
    given.install()
    first = threading.Thread(target=crash_points.crash_point, args=("before_manifest",))
    first.start()
    while not (tmp_path / HELD).exists():
        first.join(0.01)
    crash_points.crash_point("before_manifest")  # a later arrival passes
    crash_points.crash_point("after_manifest")
    assert first.is_alive()
    (tmp_path / RELEASE).touch()
    first.join(5)
    assert not first.is_alive()


def test_a_crash_never_fires_outside_the_sinks_group_or_session() -> None:
    stranger = max(os.getpgrp(), os.getsid(0)) + 7_654_321
    kill_group(stranger)  # returns: this process is not in that group or session
    SinkFaults(crash_at="after_write", group=stranger).install()
    crash_points.crash_point("after_write")


def test_a_crash_kills_the_group_it_leads(tmp_path: Path) -> None:
    child = (
        "import os; from pidfence.testing import SinkFaults; from pidfence.spark_sink import "
        "crash_points; SinkFaults(crash_at='before_manifest', group=os.getpid()).install(); "
        "crash_points.crash_point('after_write'); print('alive', flush=True); "
        "crash_points.crash_point('before_manifest'); print('not reached')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == -9
    assert proc.stdout == "alive\n"


def test_the_spark_python_wrapper_installs_the_hook_then_runs_the_module(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(
        "import sys\nfrom pidfence.spark_sink import crash_points\n"
        "if __name__ == '__main__':\n"
        "    print(crash_points._hook is not None, sys.argv[1:])\n"
    )
    python = python_wrapper(SinkFaults(fail_first_attempt=True), tmp_path / "bin")
    proc = subprocess.run(
        [str(python), "-m", "probe_mod", "x", "y"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True ['x', 'y']"


def test_run_argv_wraps_a_pidfence_command_line() -> None:
    full = [sys.executable, "-c", "from pidfence.cli import main; main()", "sink", "--x", "1"]
    argv = run_argv(full, crash_at="after_write", mutations=("resend-new-seq-on-timeout",))
    assert argv[:3] == [sys.executable, "-m", "pidfence.testing.run"]
    assert argv[argv.index("--") + 1 :] == ["sink", "--x", "1"]
    assert run_argv(["produce"])[-2:] == ["--", "produce"]


def test_an_unknown_mutation_names_the_known_ones() -> None:
    with pytest.raises(UnknownMutation, match="resend-new-seq-on-timeout"):
        install_mutation("nope")


@dataclass
class FakeProc:
    name: str
    running: bool = True
    code: int | None = None

    def exit_code(self) -> int | None:
        return self.code


def test_the_supervisor_restarts_after_exit_75_and_is_done_after_exit_0() -> None:
    clock = ManualClock(100.0)
    procs = [FakeProc("p")]
    supervisor = Supervisor(
        "p",
        lambda: procs[-1],
        lambda: procs.append(FakeProc(f"p.r{len(procs)}")),
        backoff_s=1.0,
        clock=clock,
    )
    supervisor.poll()
    procs[0].running, procs[0].code = False, 75
    supervisor.poll()
    assert len(procs) == 1  # backing off
    clock.now += 1.5
    supervisor.poll()
    assert len(procs) == 2 and supervisor.restarts == 1
    procs[1].running, procs[1].code = False, 0
    supervisor.poll()
    assert supervisor.done and supervisor.exits == [("p", 75), ("p.r1", 0)]


def test_an_exit_75_the_supervisor_has_not_polled_yet_is_pending() -> None:
    # The demo blocks on its mid-run sink pass; producers that exit 75 meanwhile must still be
    # waited for and restarted, not taken for finished.
    procs = [FakeProc("p")]
    supervisor = Supervisor("p", lambda: procs[-1], lambda: procs.append(FakeProc("p.r1")))
    supervisor.poll()
    assert not supervisor.pending
    procs[0].running, procs[0].code = False, 75
    assert supervisor.pending  # before any poll saw it
    procs[0].code = 0
    assert not supervisor.pending


def test_the_supervisor_fails_on_any_other_exit() -> None:
    proc = FakeProc("p", running=False, code=3)
    with pytest.raises(ServiceFailed, match="exited with 3"):
        Supervisor("p", lambda: proc, lambda: None).poll()


class FakeLinks(LinkFaults):
    def __init__(self) -> None:
        super().__init__({Link.PRODUCER_KAFKA: [object()]})  # type: ignore[list-item]
        self.log: list[str] = []

    def apply(self, index: int, fault: object) -> None:
        self.log.append(f"on {index}")
        self._active[index] = []

    def clear(self, index: int) -> None:
        self.log.append(f"off {index}")
        self._active.pop(index, None)


def test_the_nemesis_puts_toxics_on_and_off_at_their_times_and_skips_links_it_lacks() -> None:
    plan = FaultPlan(
        (
            step(FaultKind.LATENCY, Link.PRODUCER_KAFKA, at_s=1, duration_s=2),
            step(FaultKind.RESET, Link.PRODUCER_KAFKA, at_s=2, duration_s=2),
            step(FaultKind.BLACKHOLE, Link.SINK_KAFKA, at_s=0, duration_s=1),
        ),
        seed=5,
    )
    clock, links = ManualClock(100.0), FakeLinks()
    nemesis = NetworkNemesis(plan, links, clock=clock)
    assert "skipped" in nemesis.events[0]
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):
        clock.now = 100.0 + t
        nemesis.poll()
    assert links.log == ["on 1", "on 2", "off 1", "off 2"]
    assert nemesis.done and nemesis.happened and nemesis.healed_at == 104.0
