"""Two ``pidfence sink`` processes on one output and checkpoint, as a supervisor runs them
(issue 45, point 4): a second sink restarted whenever it exits never takes the running one
down, twins started at the same moment leave the output intact, and the next run continues.

After every round ``pidfence verify`` compares the send ledger with the output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_OK
from pidfence.demo.procs import pidfence_argv, sink_args
from pidfence.services.process import track
from tests.fixtures.commands import run_pidfence
from tests.integration.test_delta_shared import Upstream, written_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STANDBY = "held by another sink instance"
#: Generous bound for one state of a Spark driver on a busy 2-core machine (not a timed claim).
LIMIT_S = 300.0


class SinkProcess:
    """One streaming ``pidfence sink`` in its own session, its output in a file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = track(
                subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "COLUMNS": "200"},
                )
            )

    def text(self) -> str:
        """Everything it printed so far."""
        return self.log.read_text(errors="replace")

    def batches(self) -> list[int]:
        """The batches it printed as committed."""
        return [int(b) for b in re.findall(r"^batch (\d+):", self.text(), re.M)]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM the sink (it stops after its batch), or SIGKILL its whole process group (a
        lost machine); its exit code."""
        if self.proc.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        return self.proc.wait(LIMIT_S)


def _wait_for(what: str, check: Callable[[], bool], alive: list[SinkProcess]) -> None:
    """Wait for a state (not a time); fail at once if a sink that must stay up exits."""
    deadline = time.monotonic() + LIMIT_S
    while not check():
        for sink in alive:
            assert sink.proc.poll() is None, f"exited waiting for {what}:\n{sink.text()}"
        assert time.monotonic() < deadline, f"no {what} after {LIMIT_S:.0f} s"
        time.sleep(0.3)


def _verify(ledger: Path, out: Path) -> None:
    args = ("verify", "--ledger", str(ledger), "--output", str(out), "--json")
    result = run_pidfence(*args, timeout=300)
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert all(f["count"] == 0 for f in report["findings"].values()), report["findings"]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[SinkProcess]]:
    """Every sink the test starts; whatever is left is killed at the end."""
    sinks: list[SinkProcess] = []
    yield sinks
    for sink in sinks:
        if sink.proc.poll() is None:
            os.killpg(sink.proc.pid, signal.SIGKILL)
            sink.proc.wait()


@pytest.mark.slow  # over a minute: handed out first under xdist (tests/README.md)
def test_a_restarted_second_sink_never_takes_down_the_owner_and_twins_leave_it_intact(
    kafka: Any, new_topic: Any, tmp_path: Path, started: list[SinkProcess]
) -> None:
    topic = new_topic(partitions=2)
    out, ckpt, ledger = tmp_path / "out", tmp_path / "ckpt", tmp_path / "ledger.jsonl"
    argv = pidfence_argv("sink", *sink_args(kafka.bootstrap, topic, out, ckpt), "--trigger", "0.5")
    argv += ["--master", "local[1]"]
    up = Upstream(kafka.bootstrap, topic, ledger)

    def start(name: str) -> SinkProcess:
        sink = SinkProcess(argv, tmp_path / f"{name}.out")
        started.append(sink)
        return sink

    sent = 0

    def send(n: int) -> None:
        nonlocal sent
        up.send(101, range(sent, sent + n), 0)
        up.send(102, range(sent, sent + n), 1)
        sent += n

    send(20)
    owner = start("owner")
    _wait_for("the owner's first records", lambda: written_rows(out) == 2 * sent, [owner])

    # A supervisor restarts the second sink whenever it exits; here it is stopped as a
    # supervisor or a person would (SIGTERM, SIGKILL) while it waits as a standby.
    for round_, sig in enumerate((signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)):
        second = start(f"second{round_}")
        _wait_for("the standby's line", lambda s=second: STANDBY in s.text(), [owner, second])
        assert f"process {owner.proc.pid}" in second.text()
        send(10)
        _wait_for(f"round {round_}'s records", lambda: written_rows(out) == 2 * sent, [owner])
        code = second.stop(sig)
        assert code in (EXIT_OK, -signal.SIGKILL), second.text()
        assert owner.proc.poll() is None, owner.text()
        assert second.batches() == [], second.text()
        _verify(ledger, out)

    # Twins started at the same moment once the owner stopped: one runs, the other waits.
    assert owner.stop() == EXIT_OK, owner.text()
    twins = [start("twin_a"), start("twin_b")]
    send(10)
    _wait_for("the twins' records", lambda: written_rows(out) == 2 * sent, twins)
    _wait_for("one standby", lambda: any(STANDBY in t.text() for t in twins), twins)
    runner, standby = sorted(twins, key=lambda t: STANDBY in t.text())
    assert STANDBY not in runner.text() and standby.batches() == [], standby.text()
    _verify(ledger, out)
    # The runner stops; the standby takes over at once (the claim is released) and continues.
    assert runner.stop() == EXIT_OK, runner.text()
    send(10)
    _wait_for("the standby's records", lambda: written_rows(out) == 2 * sent, [standby])
    assert standby.stop() == EXIT_OK, standby.text()
    printed = [set(s.batches()) for s in started]
    assert all(not (a & b) for i, a in enumerate(printed) for b in printed[i + 1 :]), printed
    _verify(ledger, out)

    # The next run continues from the same checkpoint.
    send(10)
    once = (*sink_args(kafka.bootstrap, topic, out, ckpt), "--available-now")
    result = run_pidfence("sink", *once, "--master", "local[1]", timeout=LIMIT_S)
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    assert written_rows(out) == 2 * sent
    _verify(ledger, out)
