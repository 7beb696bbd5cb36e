"""What a demo run is made of, in immutable pieces: where its files go, where its services are,
what the faults did, what each sink pass did. :func:`pidfence.demo.summary.collect` reads a
:class:`DemoRecord`; the runner builds one piece per phase.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.demo.config import BadDemoOption, DemoConfig
from pidfence.demo.procs import Worker
from pidfence.services.process import pid_alive
from pidfence.wire import PidfenceError

#: The file that marks a folder as a demo's ``--out``.
MARKER = ".pidfence-demo"


class OutRefused(BadDemoOption):
    """``--out`` names a folder the demo must not reset (exit 2)."""


class OutUnusable(PidfenceError):
    """``--out`` cannot be created, read or written (exit 3)."""


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

    @property
    def marker(self) -> Path:
        """The file that says ``out`` is a demo's: written on first use, required to reuse a
        non-empty ``out``."""
        return self.out / MARKER

    @property
    def services(self) -> Path:
        """What ``--keep-running`` left running (addresses and pids)."""
        return self.out / "services.json"

    @property
    def pki(self) -> Path:
        """The lease servers' certificates and tokens, made for each run (under ``run``, so the
        README's ``out/pki`` is never touched)."""
        return self.run / "pki"

    def folders(self) -> tuple[Path, ...]:
        """The folders :meth:`reset` deletes."""
        return (
            self.ledgers,
            self.logs,
            self.state,
            self.run,
            self.sink_output,
            self.sink_checkpoint,
        )

    def owned(self) -> tuple[Path, ...]:
        """What :meth:`reset` deletes or a run overwrites."""
        return (*self.folders(), self.services, self.out / "summary.json", self.out / "report.html")

    def check_usable(self) -> None:
        """Refuse an ``out`` this run must not reset: one holding what the demo would delete or
        overwrite but no :data:`MARKER` (not the demo's: ``--out .`` in a project), or one whose
        ``services.json`` names a process still alive (a ``--keep-running`` run's services).

        Raises:
            OutRefused: either; the message says what to do.
            OutUnusable: ``out`` cannot be read or written.
        """
        out = self.out
        try:
            if out.exists() and not out.is_dir():
                raise OutUnusable(f"--out {out} is not a folder")
            if out.is_dir() and not self.marker.exists():
                found = sorted(p.name for p in self.owned() if p.exists())
                if found:
                    raise OutRefused(
                        f"--out {out} holds {', '.join(found)} but no {MARKER} marker: not a "
                        "demo's folder, and the demo would delete them; choose another --out "
                        "(an empty or new folder)"
                    )
            alive = self.kept_alive()
        except OSError as exc:
            raise OutUnusable(f"cannot use --out {out}: {exc}") from exc
        if alive:
            pids = " ".join(str(p) for p in alive)
            raise OutRefused(
                f"{self.services} lists services still running from a --keep-running run (pids "
                f"{pids}): stop them (kill {pids}) or choose another --out"
            )

    def kept_alive(self) -> list[int]:
        """The pids ``services.json`` lists that are still alive."""
        try:
            recorded = json.loads(self.services.read_text()).get("pids", {})
        except FileNotFoundError:
            return []
        except ValueError:
            return []  # not ours to judge: reset replaces it
        alive = []
        for pid in recorded.values() if isinstance(recorded, dict) else ():
            if isinstance(pid, int) and pid > 0 and pid_alive(pid):
                alive.append(pid)
        return alive

    def reset(self) -> None:
        """Remove a previous run's data (after :meth:`check_usable`); keep anything else in
        ``out``; mark ``out`` as the demo's.

        Raises:
            OutUnusable: ``out`` cannot be written.
        """
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.marker.write_text("pidfence demo output: `pidfence demo --out` may reset it\n")
            for path in self.folders():
                shutil.rmtree(path, ignore_errors=True)
            self.services.unlink(missing_ok=True)
            for path in (self.ledgers, self.logs, self.state):
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutUnusable(f"cannot write --out {self.out}: {exc}") from exc


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
    #: Producer or copier instances that crashed on their own (exit 1: an uncaught error), one
    #: line each with their log: anomalies, not failures of the environment.
    crashed: Sequence[str] = ()


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
