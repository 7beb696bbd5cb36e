"""A replaced producer stores nothing (real Kafka, real lease server): ``checkpoint()`` asks the
lease authority whether a resume of its checkpoint moved the pid on, so a zombie's periodic save
cannot overwrite its replacement's state with a position the sink never appended."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator import LeaseServerThread
from pidfence.producer import IdempotentProducer, LeaseState, ProducerFenced
from pidfence.wire import Verdict
from tests.fixtures.commands import produce_args, state_count
from tests.fixtures.produced import PIDFENCE, producer_for, read_topic, replay, run_cli

pytestmark = pytest.mark.timeout(240)


def test_a_replaced_producer_cannot_checkpoint(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=2)
    zombie, client = producer_for(kafka, lease_server)
    with client:
        for i in range(10):
            zombie.produce(topic, b"a%d" % i, partition=i % 2)
        assert zombie.flush(30) == 0
        checkpoint = zombie.checkpoint()  # the owner's: confirmed
        heir = IdempotentProducer.resume(checkpoint, client, zombie.config)
        for i in range(10, 14):
            zombie.produce(topic, b"a%d" % i, partition=i % 2)  # FENCED: the heir bumped
        assert zombie.flush(30) == 0
        with pytest.raises(ProducerFenced, match="was replaced"):
            zombie.checkpoint()
        assert zombie.state is LeaseState.FENCED
        zombie.close()
        assert heir.checkpoint().generation > checkpoint.generation
        heir.close()
    verdicts = Counter(v for r, v in replay(read_topic(kafka.bootstrap, topic)) if r.value)
    assert verdicts == {Verdict.APPENDED: 10, Verdict.FENCED: 4}


def test_a_paused_produce_stops_at_its_next_save_instead_of_overwriting_its_replacements(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """The review's case with ``pidfence produce`` and ONE state file: A saves and is paused
    (SIGSTOP); B resumes that file, writes 5 records, saves and ends; A is continued, writes on
    under its fenced generation and comes to its next save. Storing it would put the file past
    records the sink FENCED (B never wrote them), and C's resume from it would skip them. A
    stops there instead (exit 3, "replaced"), and C continues the file: every record is
    appended exactly once. (A paused between its question and its write finishes that one
    save when continued: confirmed before B's resume, it is true, as every record it covers
    was acknowledged before B's FENCE.)"""
    topic = new_topic(partitions=2)
    state = tmp_path / "p.json"
    common = produce_args(
        kafka.bootstrap, lease_server.address, topic, "--keys", "0", "--checkpoint-every", "20"
    )
    shaped = ("--rate", "400", "--state", str(state))
    zombie_err = tmp_path / "zombie.err"
    with zombie_err.open("w") as err:
        zombie = subprocess.Popen(
            [PIDFENCE, *common, "--count", "1000000", *shaped],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            while state_count(state, "next_i") < 100:
                assert zombie.poll() is None, zombie_err.read_text()
                _wait(zombie, 0.05)
            os.kill(zombie.pid, signal.SIGSTOP)
            paused_at = state_count(state, "next_i")
            heir = run_cli(*common, "--count", str(paused_at + 5), *shaped)
            assert heir.returncode == 0, heir.stderr
            assert state_count(state, "next_i") == paused_at + 5
            os.kill(zombie.pid, signal.SIGCONT)
            _wait(zombie, 60)
        finally:
            if zombie.poll() is None:
                os.kill(zombie.pid, signal.SIGKILL)
            zombie.wait(30)
    assert zombie.returncode == 3, zombie_err.read_text()
    assert "ProducerFenced" in zombie_err.read_text() and "replaced" in zombie_err.read_text()
    # B's save stands, or the one A had confirmed before its pause (a save is 20 records).
    assert state_count(state, "next_i") in (paused_at + 5, paused_at + 20)
    total = paused_at + 60
    last = run_cli(*common, "--count", str(total), *shaped)
    assert last.returncode == 0, last.stderr
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    appended = [json.loads(r.value or b"{}")["i"] for r, v in verdicts if v is Verdict.APPENDED]
    assert sorted(appended) == list(range(total))


def _wait(process: subprocess.Popen[Any], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(seconds)
