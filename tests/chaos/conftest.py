"""Helpers shared by the chaos tests: producer roles, the sink pass and the checker.

The processes and fault scripts come from ``pidfence.demo`` so the demo and these tests exercise
one code path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pidfence.demo.procs import ProducerRole, ProducerSpec, Worker
from pidfence.ledger import read_ledger


@dataclass
class Outcome:
    """What the sink wrote and what the checker said."""

    report: Any
    log: pa.Table
    rejects: pa.Table

    @property
    def verdicts(self) -> Counter[str]:
        """Drop counts by verdict (APPENDED is the log's row count)."""
        counts = Counter(str(v) for v in self.rejects.column("verdict").to_pylist())
        counts["APPENDED"] = self.log.num_rows
        return counts

    def anomalies(self) -> dict[str, int]:
        """Checker anomaly counts."""
        from pidfence.demo.summary import anomaly_counts

        return anomaly_counts(self.report)

    def assert_clean(self) -> None:
        """Zero anomalies, with the checker's examples in the failure message."""
        from pidfence.demo.summary import anomaly_examples

        assert self.report.ok, (self.anomalies(), anomaly_examples(self.report))


@dataclass
class ChaosKit:
    """Builds producer roles under one test's tmp folder and checks the pipeline's outcome."""

    tmp: Path
    #: Roles :meth:`start` spawned, stopped at teardown.
    started: list[ProducerRole] = field(default_factory=list)

    @property
    def ledgers(self) -> Path:
        """Where every instance writes its ledger."""
        path = self.tmp / "ledgers"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def logs(self) -> Path:
        """Process logs."""
        path = self.tmp / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def role(
        self, name: str, bootstrap: str, lease_servers: str, topic: str, count: int, **options: Any
    ) -> ProducerRole:
        """A producer role (not started): :class:`ProducerSpec` with its state file under tmp."""
        state = self.tmp / f"{name}.state.json"
        spec = ProducerSpec(name, bootstrap, lease_servers, topic, count, state, **options)
        return ProducerRole(spec, self.ledgers, self.logs)

    def start(
        self, name: str, bootstrap: str, lease_servers: str, topic: str, count: int, **options: Any
    ) -> ProducerRole:
        """:meth:`role`, spawned; the ``chaos`` fixture stops it at teardown."""
        role = self.role(name, bootstrap, lease_servers, topic, count, **options)
        self.started.append(role)
        role.spawn()
        return role

    def sink(self, spark: Any, bootstrap: str, topic: str, **kwargs: Any) -> Any:
        """One available-now pass of the sink over ``topic`` (continues from its checkpoint)."""
        from pidfence.spark_sink import run_sink

        return run_sink(
            spark,
            bootstrap,
            topic,
            str(self.tmp / "output"),
            str(self.tmp / "checkpoint"),
            available_now=True,
            **kwargs,
        )

    def clean_outcome(self, spark: Any, bootstrap: str, topic: str, **kwargs: Any) -> Outcome:
        """:meth:`sink` then :meth:`outcome`, asserted clean (zero anomalies)."""
        self.sink(spark, bootstrap, topic, **kwargs)
        outcome = self.outcome()
        outcome.assert_clean()
        return outcome

    def outcome(self) -> Outcome:
        """The output log, the rejects and the checker's report over every ledger."""
        from pidfence.spark_sink import read_log, read_rejects
        from pidfence.verify.check import check

        log = read_log(str(self.tmp / "output"))
        rejects = read_rejects(str(self.tmp / "output"))
        report = check(list(read_ledger([self.ledgers])), log, rejects)
        return Outcome(report, log, rejects)


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[ChaosKit]:
    """A :class:`ChaosKit`; every role it started is stopped at teardown."""
    kit = ChaosKit(tmp_path)
    yield kit
    for role in reversed(kit.started):
        role.stop()


@pytest.fixture
def stop_all() -> Iterator[Callable[[ProducerRole | Worker], None]]:
    """Register roles/workers to stop at teardown (a failing test leaves nothing running)."""
    items: list[ProducerRole | Worker] = []
    yield items.append
    for item in reversed(items):
        item.stop()
