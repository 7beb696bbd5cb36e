"""Subprocesses the demo and the chaos tests start: producers, the copier, the sink (the lease
servers are :mod:`pidfence.demo.start`'s).

Every process is a :class:`pidfence.services.process.ManagedProcess`: its own session (a Ctrl-C
in the terminal reaches only the demo, which stops them in order), its output in a log file, and
signals sent to its pid only. A :class:`Worker` adds the send ledger the process writes, read
incrementally so progress can be polled cheaply.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pidfence.services.process import ManagedProcess, RunsProcess, wait_until
from pidfence.testing.launch import run_argv

#: Runs the ``pidfence`` CLI with this interpreter (works without the console script on PATH).
PIDFENCE = (sys.executable, "-c", "from pidfence.cli import main; main()")


def pidfence_argv(*args: str) -> list[str]:
    """The argv of ``pidfence ARGS...`` run by this interpreter."""
    return [*PIDFENCE, *args]


def cli_options(**values: object) -> list[str]:
    """``--name VALUE`` per keyword, in order (``value_size`` is ``--value-size``; a float is
    written ``%g``); a keyword given None is left out, so the command's default applies."""
    args: list[str] = []
    for name, value in values.items():
        if value is not None:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            args += [f"--{name.replace('_', '-')}", text]
    return args


class Worker(RunsProcess):
    """One pidfence subprocess (producer, copier, sink) plus the ledger it writes, if any.

    Args:
        name: a unique instance name (``p1``, ``p1.r1``); names the log and ledger files.
        argv: the command line.
        log_dir: where ``NAME.log`` goes.
        ledger: the send ledger this instance writes (None for processes without one).
        env: extra environment variables.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        ledger: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.proc = ManagedProcess(name, argv, log_dir / f"{name}.log", env=env)
        #: How a fault script ended this instance (``killed``, ``replaced``, ``fenced``), if it did.
        self.fate: str | None = None
        #: Event ids (the ledger's ``event``, else the value digest) this instance got acknowledged.
        self.events: set[str] = set()
        #: The latest ``expire_ms`` (lease end) among its acknowledged records.
        self.lease_end_ms = 0
        self._read_at = 0
        self._acked = 0
        self._fences = 0

    def start(self) -> Worker:
        """Start the process."""
        self.proc.start()
        return self

    def wait(self, timeout: float) -> int:
        """Wait for the exit; :class:`ServiceFailed` (with the log tail) after ``timeout``."""
        wait_until(lambda: not self.running, timeout, f"{self.name} to finish", 0.2, self.tail())
        code = self.exit_code()
        return -1 if code is None else code

    def tail(self, lines: int = 30) -> str:
        """The end of the process's log."""
        return self.proc.log_tail(lines)

    def _scan(self) -> None:
        if self.ledger is None or not self.ledger.exists():
            return
        with self.ledger.open("rb") as handle:
            handle.seek(self._read_at)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1
        self._read_at += end
        for raw in chunk[:end].splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            self.lease_end_ms = max(self.lease_end_ms, int(entry.get("expire_ms") or 0))
            if entry.get("fence"):
                self._fences += 1
                continue
            self._acked += 1
            self.events.add(str(entry.get("event") or entry.get("digest")))

    def acked(self) -> int:
        """Data records this instance's ledger holds so far (acknowledged by Kafka)."""
        self._scan()
        return self._acked

    def fences(self) -> int:
        """FENCE records this instance's ledger holds so far."""
        self._scan()
        return self._fences

    def final_state(self) -> str:
        """``running``, or how it ended: ``done``, a fault's ``killed``/``replaced``/``fenced``,
        or ``failed (exit N)``."""
        if self.fate is not None:
            return self.fate
        if self.running:
            return "running"
        code = self.exit_code()
        if code is None:
            return "not started"
        return "done" if code == 0 else f"failed (exit {code})"


@dataclass(frozen=True)
class ProducerSpec:
    """What one ``pidfence produce`` load generator does; instances share it across restarts.

    Args:
        name: the producer's name (also written into each value by the CLI).
        bootstrap: Kafka bootstrap servers.
        lease_servers: ``host:port[,host:port]``.
        topic: the topic written.
        count: records in total across all instances.
        state: the ``--state`` checkpoint file (resume point).
        rate: records per second (0: as fast as possible).
        resend_every: re-send the last acknowledged records every N records (0: never).
        keys: distinct keys (spread over partitions).
        value_size: bytes per value.
        checkpoint_every: flush and save the state file every N records (the fault scripts
            copy or resume from it, so it must cover data well before the run ends).
        extra: more CLI arguments, passed through.
        mutations: deliberately broken builds to run it as
            (:data:`pidfence.testing.mutations.MUTATIONS`; tests that prove a check has teeth).
    """

    name: str
    bootstrap: str
    lease_servers: str
    topic: str
    count: int
    state: Path
    rate: float = 0.0
    resend_every: int = 0
    keys: int = 1000
    value_size: int = 100
    checkpoint_every: int = 50
    extra: tuple[str, ...] = field(default=())
    mutations: tuple[str, ...] = field(default=())

    def argv(self, ledger: Path) -> list[str]:
        """The ``pidfence produce`` command line writing ``ledger``."""
        args = [
            "produce",
            *cli_options(
                bootstrap=self.bootstrap,
                lease_server=self.lease_servers,
                topic=self.topic,
                count=self.count,
                keys=self.keys,
                value_size=self.value_size,
                state=self.state,
                ledger=ledger,
                name=self.name,
                checkpoint_every=self.checkpoint_every,
                rate=self.rate or None,
                resend_every=self.resend_every or None,
            ),
        ]
        if self.mutations:
            return run_argv([*args, *self.extra], mutations=self.mutations)
        return pidfence_argv(*args, *self.extra)


class ProducerRole:
    """A logical producer and every instance of it started so far (restarts, replacements).

    Each instance writes its own ledger file ``ledger_dir/INSTANCE.jsonl``, so a zombie and its
    replacement never interleave lines in one file.
    """

    def __init__(self, spec: ProducerSpec, ledger_dir: Path, log_dir: Path) -> None:
        self.spec = spec
        self.ledger_dir = ledger_dir
        self.log_dir = log_dir
        self.instances: list[Worker] = []

    def spawn(self, spec: ProducerSpec | None = None) -> Worker:
        """Start a new instance (from ``spec.state`` if it exists: the CLI resumes from it)."""
        use = spec or self.spec
        name = self.spec.name if not self.instances else f"{self.spec.name}.r{len(self.instances)}"
        ledger = self.ledger_dir / f"{name}.jsonl"
        worker = Worker(name, use.argv(ledger), self.log_dir, ledger=ledger).start()
        self.instances.append(worker)
        return worker

    def spawn_replacement(self) -> Worker:
        """Start a replacement from a COPY of the checkpoint while the current instance lives on.

        The replacement resumes (bump + FENCE) from the checkpoint; the old instance keeps its own
        state file, so when it wakes up it is a zombie still holding the fenced generation.
        """
        copy = self.spec.state.with_name(f"{self.spec.state.stem}.r{len(self.instances)}.json")
        shutil.copyfile(self.spec.state, copy)
        return self.spawn(replace(self.spec, state=copy))

    @property
    def current(self) -> Worker:
        """The newest instance."""
        return self.instances[-1]

    def acked(self) -> int:
        """Data records acknowledged over every instance."""
        return sum(w.acked() for w in self.instances)

    def distinct(self) -> int:
        """Distinct events acknowledged over every instance (a resent record counts once)."""
        self.acked()
        return len(set().union(*(w.events for w in self.instances)))

    def checkpointed(self) -> int:
        """Records the state file's checkpoint covers (0 before the first save with data)."""
        try:
            return int(json.loads(self.spec.state.read_text()).get("next_i", 0))
        except (OSError, ValueError):
            return 0

    def running(self) -> bool:
        """True while any instance runs."""
        return any(w.running for w in self.instances)

    def stop(self) -> None:
        """Stop every instance still running."""
        for worker in self.instances:
            worker.stop()


def copier_argv(
    bootstrap: str, lease_servers: str, from_topic: str, to_topic: str, **options: object
) -> list[str]:
    """The ``pidfence copy`` command line; ``options`` are more of its options by name
    (``state=``, ``group=``, ``ledger=``, ``idle_exit=``: :func:`cli_options`)."""
    ends = cli_options(bootstrap=bootstrap, lease_server=lease_servers)
    return pidfence_argv(
        "copy", *ends, *cli_options(from_topic=from_topic, to_topic=to_topic, **options)
    )


def sink_args(bootstrap: str, topic: str, output: Path, checkpoint: Path) -> list[str]:
    """``pidfence sink``'s options over one topic into one output."""
    return cli_options(bootstrap=bootstrap, topic=topic, output=output, checkpoint=checkpoint)


def sink_argv(
    bootstrap: str,
    topic: str,
    output: Path,
    checkpoint: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``pidfence sink --available-now`` command line (a Spark driver of its own)."""
    return pidfence_argv(
        "sink",
        *sink_args(bootstrap, topic, output, checkpoint),
        "--available-now",
        "--starting-offsets",
        "earliest",
        *extra,
    )
