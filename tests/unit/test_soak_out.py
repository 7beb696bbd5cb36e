"""A reused ``PIDFENCE_SOAK_OUT`` starts clean; a folder that is not a soak's is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.demo.soak.config import SoakConfig
from pidfence.demo.soak.run import MARKER, SoakRun
from pidfence.services.process import ServiceFailed


def test_a_reused_soak_folder_loses_the_previous_runs_ledgers(tmp_path: Path) -> None:
    """An old run's ledgers (another topic) would all be judged lost beside this run's."""
    run = SoakRun(SoakConfig(out=tmp_path))
    run._fresh_out()
    (run.ledgers / "old.jsonl").parent.mkdir(parents=True)
    (run.ledgers / "old.jsonl").write_text("{}\n")
    (tmp_path / "batches.jsonl").write_text("{}\n")
    run._fresh_out()
    assert not run.ledgers.exists() and not (tmp_path / "batches.jsonl").exists()
    assert (tmp_path / MARKER).exists()


def test_a_folder_that_is_not_a_soaks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mine.txt").write_text("keep me")
    with pytest.raises(ServiceFailed, match="not a soak's folder"):
        SoakRun(SoakConfig(out=tmp_path))._fresh_out()
    assert (tmp_path / "logs" / "mine.txt").exists()
