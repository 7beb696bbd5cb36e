"""The fault harness's wrapper folders: a run killed at a crash point leaves its own behind; the
next run removes those of dead runs and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pidfence.testing import run


def test_folders_of_dead_runs_are_swept_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run.tempfile, "gettempdir", lambda: str(tmp_path))
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    dead = tmp_path / f"pidfence-testing-{dead_pid.pid}-abc"
    live = tmp_path / f"pidfence-testing-{os.getpid()}-def"
    other = tmp_path / "pidfence-testing-notapid"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "python").write_text("#!/bin/sh\n")
    run._sweep_folders_of_dead_runs()
    assert not dead.exists()
    assert live.exists() and other.exists()
