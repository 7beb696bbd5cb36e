"""What a demo run is made of, in immutable pieces: where its files go, where its services are,
what the faults did, what each sink pass did. :func:`pidfence.demo.summary.collect` reads a
:class:`DemoRecord`; the runner builds one piece per phase.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.demo.config import DemoConfig
from pidfence.demo.procs import Worker


class _Folder:
    """A read-only attribute of :class:`DemoPaths`: the folder ``name`` under its ``out``."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc

    def __get__(self, paths: DemoPaths, owner: type[DemoPaths] | None = None) -> Path:
        return paths.out / self.name


@dataclass(frozen=True)
class DemoPaths:
    """The files under ``out``."""

    out: Path

    ledgers = _Folder("ledgers", "One send ledger per producer instance.")
    logs = _Folder("logs", "One log per process.")
    state = _Folder("state", "Producer and copier checkpoints.")
    run = _Folder("run", "ZooKeeper and Kafka data.")
    sink_output = _Folder("output", "The output log (and rejects) the sink writes (local store).")
    sink_checkpoint = _Folder("checkpoint", "Spark's checkpoint (local store).")

    def reset(self) -> None:
        """Remove a previous run's data; keep anything else in ``out``."""
        for path in (
            self.ledgers,
            self.logs,
            self.state,
            self.run,
            self.sink_output,
            self.sink_checkpoint,
        ):
            shutil.rmtree(path, ignore_errors=True)
        for path in (self.ledgers, self.logs, self.state):
            path.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class Endpoints:
    """Where the run's services are, once they are up.

    Attributes:
        bootstrap: Kafka, direct (topic admin, reading for the checker).
        zk_hosts: ZooKeeper, direct.
        raw_topic: the topic producers and the copier write.
        upstream_topic: the copier's source.
        lease_servers: ``host:port,...`` as producers reach them (through proxies under ``net``).
        producer_bootstrap: Kafka as producers and the copier reach it.
        sink_bootstrap: Kafka as the sink reaches it.
        output: where the sink writes its tables (a folder under ``out``, or ``s3://demo/output``
            under ``--store s3``).
        checkpoint: Spark's checkpoint, likewise.
        pids: process name -> pid of every service started here.
        metrics: component name -> the URL its Prometheus metrics are served on.
        store: the AWS environment that reaches the S3 store (``--store s3``), else empty.
    """

    bootstrap: str
    zk_hosts: str
    raw_topic: str
    upstream_topic: str
    lease_servers: str
    producer_bootstrap: str
    sink_bootstrap: str
    output: str
    checkpoint: str
    pids: Mapping[str, int] = field(default_factory=dict)
    metrics: Mapping[str, str] = field(default_factory=dict)
    store: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultOutcome:
    """What the fault scripts did, per script name."""

    events: Mapping[str, Sequence[str]]
    happened: Mapping[str, bool]
    zombie_writes: Mapping[str, int]
    #: The plan's steps, one line each (``net``: the seeded network faults).
    plan: Sequence[str] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Produced:
    """The processes that wrote: producer instances (by role) and copier instances."""

    instances: Sequence[Worker]
    copier: Sequence[Worker]
    faults: FaultOutcome


@dataclass(frozen=True)
class DemoRecord:
    """Everything :func:`pidfence.demo.summary.collect` reads."""

    config: DemoConfig
    paths: DemoPaths
    endpoints: Endpoints
    produced: Produced
    sink_passes: Sequence[Mapping[str, Any]]
    phases: Mapping[str, float]
