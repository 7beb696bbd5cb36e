"""The soak bench's long-running sink process and the faults it repeats on top of the demo's.

:class:`SinkProc` runs :mod:`pidfence.demo.soak.sink` as a child process (its own session) and
knows each instance's committed batches from the JSON lines it writes. :class:`SinkRestart` stops
the sink gracefully or crashes it (SIGKILL of the driver and every process below it, by pid) and
waits until the next instance has committed a batch. :func:`adopt_replacement` makes a producer
role's next fault start from the checkpoint its current replacement writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pidfence.demo.faults import FaultScript, KillAndResume, LeaseZombie, Zombie, lease_end_ms
from pidfence.demo.procs import ProducerRole, Worker, cli_options, sink_args
from pidfence.demo.procstat import children_map, descendants, is_stopped, parent_map
from pidfence.services.process import ManagedProcess, ServiceFailed


class SinkProc:
    """The sink's Spark driver as a child process; one instance at a time.

    Args:
        argv: a function of (label, available_now) giving the command line.
        batches: the JSON-lines file every instance appends its committed batches to.
        log_dir: where ``sink-N.log`` goes.
    """

    def __init__(
        self, argv: Callable[[str, bool], list[str]], batches: Path, log_dir: Path
    ) -> None:
        self.argv = argv
        self.batches = batches
        self.log_dir = log_dir
        self.proc: ManagedProcess | None = None
        self.label = ""
        self.started = 0
        self._read_at = 0
        #: Every batch line read so far, in file order.
        self.lines: list[dict[str, Any]] = []

    @property
    def pid(self) -> int | None:
        """The driver's pid while it runs."""
        return self.proc.pid if self.proc is not None and self.proc.running else None

    @property
    def running(self) -> bool:
        """True while the current instance runs."""
        return self.proc is not None and self.proc.running

    def start(self, available_now: bool = False) -> None:
        """Start the next instance (``sink-N``); it continues from the checkpoint."""
        self.label = f"sink-{self.started}"
        self.started += 1
        self.proc = ManagedProcess(
            self.label, self.argv(self.label, available_now), self.log_dir / f"{self.label}.log"
        )
        self.proc.start()

    def read(self) -> list[dict[str, Any]]:
        """Batch lines appended since the previous call."""
        if not self.batches.exists():
            return []
        with self.batches.open("rb") as handle:
            handle.seek(self._read_at)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1
        self._read_at += end
        new = [json.loads(raw) for raw in chunk[:end].splitlines() if raw.strip()]
        self.lines.extend(new)
        return new

    def committed(self, label: str) -> int:
        """Batches the instance ``label`` has committed so far."""
        self.read()
        return sum(1 for line in self.lines if line.get("label") == label)

    def stop(self, timeout: float = 120.0) -> None:
        """SIGTERM: the query stops after its running batch; SIGKILL after ``timeout``."""
        if self.proc is not None:
            self.proc.stop(timeout)

    def terminate(self) -> None:
        """SIGTERM without waiting: the query stops after its running batch."""
        if self.proc is not None:
            self.proc.terminate()

    def crash(self) -> int:
        """SIGKILL the driver and every process below it (JVM, PySpark workers), by pid.

        Returns:
            How many processes were killed.
        """
        if self.proc is None or self.proc.pid is None or not self.proc.running:
            return 0
        below = descendants(self.proc.pid, children_map(parent_map()))
        self.proc.kill()
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return 1 + len(below)

    def wait(self, timeout: float) -> int | None:
        """Wait for the current instance to exit; its exit code (None if still running)."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.5)
        return None if self.proc is None else self.proc.exit_code()

    def exit_code(self) -> int | None:
        """The current instance's exit code once it exited."""
        return None if self.proc is None else self.proc.exit_code()


def soak_sink_argv(
    bootstrap: str,
    topic: str,
    output: Path,
    checkpoint: Path,
    batches: Path,
    logs: Path,
    *,
    trigger_s: float,
    lifetime: str,
    master: str,
) -> Callable[[str, bool], list[str]]:
    """The command line of :mod:`pidfence.demo.soak.sink` for each instance."""

    def argv(label: str, available_now: bool) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "pidfence.demo.soak.sink",
            *sink_args(bootstrap, topic, output, checkpoint),
            *cli_options(
                batches=batches,
                label=label,
                trigger=trigger_s,
                lifetime=lifetime,
                master=master,
                spark_log=logs / f"{label}-spark.log",
            ),
        ]
        return [*args, "--available-now"] if available_now else args

    return argv


@dataclass(eq=False)
class SinkRestart(FaultScript):
    """Stop the running sink (gracefully with SIGTERM, or crash it with SIGKILL), start the next
    instance from the same checkpoint, and be done once that instance has committed a batch.

    Args:
        sink: the sink process.
        crash: SIGKILL instead of SIGTERM.
    """

    sink: SinkProc
    crash: bool
    stop_timeout_s: float = field(default=120.0, init=False)
    _old: str = field(default="", init=False)
    _label: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "sink-crash" if self.crash else "sink-restart"

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (self._stop_after_a_batch, self._start_next, self._await_first_batch)

    def _stop_after_a_batch(self) -> None:
        # Only a sink that is past its first batch is restarted: a fact, not a duration.
        if self.sink.committed(self.sink.label) == 0:
            return
        self._old = self.sink.label
        if self.crash:
            killed = self.sink.crash()
            self.note(f"SIGKILL {self._old} and {killed - 1} process(es) below it")
        else:
            self.sink.terminate()
            self.note(f"SIGTERM {self._old}: stop after the running batch")
        self._next()

    def _start_next(self) -> None:
        if self.sink.running:
            if self._waited() < self.stop_timeout_s:
                return
            self.sink.crash()
            self.note(f"{self._old} still running {self.stop_timeout_s:.0f} s after SIGTERM")
        self.note(f"{self._old} exited with {self.sink.exit_code()}")
        self.sink.start()
        self._label = self.sink.label
        self.happened = True
        self._next(f"restarted as {self._label} from the checkpoint")

    def _await_first_batch(self) -> None:
        if self.sink.committed(self._label) == 0:
            if not self.sink.running:
                raise ServiceFailed(
                    f"{self._label} exited with {self.sink.exit_code()} before its first "
                    f"batch (log {self.sink.log_dir / self._label}.log)"
                )
            return
        self.note(f"{self._label} committed its first batch {self._waited():.1f} s later")
        self.done = True


def adopt_replacement(role: ProducerRole, replacement: Worker | None) -> None:
    """Point ``role.spec.state`` at the state file ``replacement`` resumed from and writes.

    :meth:`ProducerRole.spawn_replacement` starts the replacement from a copy of the checkpoint;
    the next fault on this role must read (and resume from) that copy, not the old instance's.
    """
    if replacement is None:
        return
    argv = replacement.proc.cmd
    state = Path(argv[argv.index("--state") + 1])
    role.spec = replace(role.spec, state=state)


#: ``pidfence produce``'s fault hook: SIGSTOP itself right after its N-th state save.
STOP_AFTER_CHECKPOINT = "--stop-after-checkpoint"


def stop_after(saves: int) -> tuple[str, ...]:
    """Extra ``pidfence produce`` arguments: stop itself right after save number ``saves``."""
    return (STOP_AFTER_CHECKPOINT, str(max(1, saves)))


class SelfStoppedLeaseZombie(LeaseZombie):
    """(f) like :class:`~pidfence.demo.faults.LeaseZombie`, but the producer stops itself
    (``--stop-after-checkpoint``) right after a state save, when everything it sent has been
    acknowledged: nothing is left in its queue to land after its lease ended.

    A SIGSTOP from outside can catch records in librdkafka's queue; delivered after the lease
    ended and after the replacement's scan, under a pid the replacement could not FENCE, they
    are the residual window docs/producer.md names ("Late landings after a scan without a
    FENCE"), which only ``message_timeout_ms`` below the rollover margin closes.
    """

    #: The role's extra arguments for the instances started after the stop (the replacement
    #: must not stop itself too); None keeps the role's spec as it is.
    restore_extra: tuple[str, ...] | None = None

    def _pause_when_due(self) -> None:
        worker = self.role.current
        if worker.pid is None or not worker.running:
            raise ServiceFailed(
                f"lease-zombie: {worker.name} exited with {worker.exit_code()} before it stopped "
                f"itself (log {worker.proc.log_path})\n{worker.tail()}"
            )
        if not is_stopped(worker.pid):
            return
        if not checkpoint_has_partitions(self.role):
            # Its stop came right after a rollover's save: this round cannot use it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
            self.note(
                f"{worker.name} stopped on a checkpoint that names no partition: round skipped"
            )
            self.done = True
            return
        worker.proc.paused = True  # so stop() and resume() send SIGCONT
        if self.restore_extra is not None:
            self.role.spec = replace(self.role.spec, extra=self.restore_extra)
        self.zombie = worker
        worker.fate = "replaced"
        self.lease_end = lease_end_ms(worker)
        self._next(
            f"{worker.name} stopped itself after a state save with {self.role.acked()} "
            f"acknowledged records; its lease ends in "
            f"{max(0, self.lease_end - self.wall_ms()) / 1000:.1f} s"
        )


def checkpoint_has_partitions(role: ProducerRole) -> bool:
    """True when the role's state file names at least one partition (``next_seq``).

    A checkpoint saved by ``roll()`` right after a rollover names none yet; resuming it fails
    (the recovery scan asks Kafka for the offsets of no partition: ``_INVALID_ARG``, exit 75, the
    same on every retry), so the soak's faults take their copy or kill only from a checkpoint
    that names partitions, checked while the victim is stopped (the file cannot change then).
    """
    try:
        state = json.loads(role.spec.state.read_text())
    except (OSError, ValueError):
        return False
    return bool(state.get("checkpoint", {}).get("next_seq"))


class SoakKill(KillAndResume):
    """(a) with the victim stopped first: SIGKILL only when its checkpoint names partitions."""

    def _kill_when_due(self) -> None:
        if not self._due():
            return
        victim = self.role.current
        victim.pause()
        if checkpoint_has_partitions(self.role):
            super()._kill_when_due()
            return
        victim.resume()
        self.note(f"{victim.name}'s checkpoint names no partition yet (just rolled): later")


class SoakZombie(Zombie):
    """(b) that wakes its victim and waits again when the paused victim's checkpoint names no
    partition (saved right after a rollover)."""

    def _start_replacement(self) -> None:
        if self.zombie is not None and not checkpoint_has_partitions(self.role):
            self.zombie.resume()
            self.zombie.fate = None
            self.note(f"{self.zombie.name}'s checkpoint names no partition yet: woken, later")
            self.zombie = None
            self._step = 0
            return
        super()._start_replacement()
