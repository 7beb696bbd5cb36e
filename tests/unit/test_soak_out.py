"""A reused ``PIDFENCE_SOAK_OUT`` starts clean; a folder that is not a soak's is refused; a soak
that judged nothing, or whose producers did not stop as asked, fails."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

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


def test_a_soak_that_acknowledged_and_appended_nothing_fails_naming_why(tmp_path: Path) -> None:
    """Empty ledgers against an empty log give the checker nothing to object to: the soak's own
    verdict must fail the run (as the demo's checker refuses an empty ledger folder)."""
    run = SoakRun(SoakConfig(out=tmp_path), log=lambda line: None)
    run._fresh_out()
    run.ledgers.mkdir()
    run._check()  # no ledger entry, no output table
    assert not run.result.ok
    assert run.result.anomalies["nothing_acknowledged"] == 1
    assert run.result.anomalies["nothing_appended"] == 1
    assert str(run.ledgers) in run.result.examples["nothing_acknowledged"][0]
    assert "appended no record" in run.result.examples["nothing_appended"][0]


def test_hollow_run_names_each_empty_side() -> None:
    from pidfence.demo.soak.run import HOLLOW, hollow_run

    ledgers, output = Path("l"), Path("o")
    assert hollow_run(10, 8, ledgers, output) == {}
    assert set(hollow_run(0, 8, ledgers, output)) == {"nothing_acknowledged"}
    assert set(hollow_run(10, 0, ledgers, output)) == {"nothing_appended"}
    assert set(hollow_run(0, 0, ledgers, output)) == set(HOLLOW)


def test_only_a_flushed_or_finished_producer_ends_as_the_final_sigint_asks() -> None:
    """0 (done) and 130 (interrupted, flushed) are how a producer answers SIGINT; a crash (1), a
    producer that could not drain (75) or one killed by another signal is a failure."""
    from pidfence.demo.soak.run import unexpected_stops

    exits = [("p0", 130), ("p1", 0), ("p2", -2), ("p3", 1), ("p4", 75), ("p5", -9)]
    failures = unexpected_stops(exits)
    assert [f.split()[0] for f in failures] == ["p3", "p4", "p5"]
    assert failures[0].startswith("p3 exited with 1 after the final SIGINT")


class _Stopped:
    """A producer instance that runs until the soak's SIGINT, then exits with ``code``."""

    def __init__(self, name: str, code: int) -> None:
        self.name, self.code, self.pid = name, code, None
        self.proc = SimpleNamespace(log_path=Path(f"{name}.log"))
        self._asked = 0

    @property
    def running(self) -> bool:
        self._asked += 1
        return self._asked == 1  # running when the soak looks, gone once it waits

    def exit_code(self) -> int:
        return self.code


def test_a_producer_that_exits_badly_after_the_final_sigint_fails_the_soak(
    tmp_path: Path,
) -> None:
    run = SoakRun(SoakConfig(out=tmp_path), log=lambda line: None)
    workers = [_Stopped("p0", 130), _Stopped("p1", 1)]
    run.roles = [SimpleNamespace(instances=[w]) for w in workers]  # type: ignore[misc]
    run._stop_producers()
    assert not run.result.ok
    assert len(run.result.failures) == 1
    assert run.result.failures[0].startswith("p1 (log p1.log) exited with 1 after the final")
