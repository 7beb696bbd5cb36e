"""The producer, copier and server fault scripts the demo and the chaos tests share.

Each is a :class:`pidfence.testing.FaultScript` (polled, never blocking for long, waiting for
facts rather than durations); :func:`pidfence.testing.drive` runs them together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pidfence.demo.config import ZOMBIE_LEASE_LEFT
from pidfence.demo.procs import ProducerRole, Worker
from pidfence.pid_allocator.clock import wall_clock_ms
from pidfence.services.process import ServiceFailed
from pidfence.testing.script import FaultScript, drive


@dataclass(eq=False)
class ProducerFault(FaultScript):
    """Base of the scripts that strike a producer role once it has ``at`` records acknowledged
    and a stored checkpoint (a restarted instance needs one to resume from)."""

    role: ProducerRole
    at: int

    def _due(self) -> bool:
        return self.role.acked() >= self.at and self.role.checkpointed() > 0


class KillAndResume(ProducerFault):
    """(a) SIGKILL a producer once it has ``at`` records acknowledged; restart it from ``--state``.

    The restarted instance resumes from the last checkpoint: it bumps the generation and writes
    a FENCE to every partition, then re-sends what followed the checkpoint (DUPLICATE verdicts).
    """

    name = "kill"

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (self._kill_when_due, self._restart)

    def _kill_when_due(self) -> None:
        if not self._due():
            return
        victim = self.role.current
        victim.kill()
        victim.fate = "killed"
        self.happened = True
        self._next(f"SIGKILL {victim.name} after {self.role.acked()} acknowledged records")

    def _restart(self) -> None:
        worker = self.role.spawn()
        self.note(f"restarted as {worker.name} from {self.role.spec.state.name}")
        self.done = True


@dataclass(eq=False)
class Takeover(ProducerFault):
    """Base of the zombie scripts: freeze the current instance, start its replacement from a
    copy of its checkpoint, wake the old instance once the replacement has written.

    Attributes:
        zombie: the frozen (later woken) instance.
        replacement: the instance resumed from the copy.
        zombie_wrote: records the zombie got acknowledged after SIGCONT (its fenced writes).
    """

    wall_ms: Callable[[], int] = field(default=wall_clock_ms, kw_only=True)
    zombie: Worker | None = field(default=None, init=False)
    replacement: Worker | None = field(default=None, init=False)
    _zombie_acked: int = field(default=0, init=False)
    zombie_wrote: int = field(default=0, init=False)

    def _freeze(self) -> Worker:
        """SIGSTOP the current instance: the zombie-to-be."""
        zombie = self.zombie = self.role.current
        zombie.pause()
        zombie.fate = "replaced"
        return zombie

    def _both(self) -> tuple[Worker, Worker]:
        """The zombie and its replacement, once both exist."""
        if self.replacement is None or self.zombie is None:
            raise ServiceFailed(f"{self.name} fault script lost its processes (a pidfence bug)")
        return self.zombie, self.replacement

    @staticmethod
    def _failed_before(worker: Worker, what: str) -> ServiceFailed:
        """The error for a replacement that exited before ``what`` (its log attached)."""
        return ServiceFailed(
            f"replacement {worker.name} exited with {worker.exit_code()} before {what} "
            f"(log {worker.proc.log_path})\n{worker.tail()}"
        )

    def _wake(self, zombie: Worker, event: str) -> None:
        """SIGCONT the zombie, counting its writes from here, and go on to the next step
        (``event``: what the replacement had done by then)."""
        self._zombie_acked = zombie.acked()
        zombie.resume()
        self._next(event)


@dataclass(eq=False)
class Zombie(Takeover):
    """(b) SIGSTOP a producer, start its replacement from a copy of its checkpoint, wait until the
    replacement's FENCE records are acknowledged, SIGCONT the old instance and let it write with
    its fenced generation for ``zombie_records`` records (or ``zombie_s`` seconds), then SIGKILL it.

    The zombie is killed in the end. One that reaches its rollover point first stops by itself
    (its roll is refused: the replacement rolled the pid on) and counts as fenced too.
    """

    name = "zombie"

    zombie_records: int = 50
    zombie_s: float | None = None
    lease_left_ms: int = 0

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (self._pause_when_due, self._start_replacement, self._wake_once_fenced, self._end)

    def _pause_when_due(self) -> None:
        if not self._due():
            return
        # Pause only under a lease with room left, so the woken zombie writes under its
        # fenced generation before its rollover point (a fact read from the ledger).
        left = lease_end_ms(self.role.current) - self.wall_ms()
        if self.lease_left_ms and left < self.lease_left_ms:
            return
        zombie = self._freeze()
        self._next(f"SIGSTOP {zombie.name} after {self.role.acked()} acknowledged records")

    def _start_replacement(self) -> None:
        self.replacement = self.role.spawn_replacement()
        self._next(f"replacement {self.replacement.name} resumes from a copy of the checkpoint")

    def _wake_once_fenced(self) -> None:
        zombie, replacement = self._both()
        if replacement.fences() == 0 or replacement.acked() == 0:
            if not replacement.running and replacement.fences() == 0:
                raise self._failed_before(replacement, "fencing")
            return
        self._wake(
            zombie,
            f"SIGCONT {zombie.name}: replacement fenced "
            f"{replacement.fences()} partition(s) and wrote {replacement.acked()}",
        )

    def _end(self) -> None:
        zombie, _ = self._both()
        wrote = zombie.acked() - self._zombie_acked
        timed_out = self.zombie_s is not None and self._waited() >= self.zombie_s
        if wrote < self.zombie_records and not timed_out and zombie.running:
            return
        stopped = not zombie.running and refused_its_roll(zombie)
        zombie.kill()
        self.zombie_wrote = wrote
        # The fault is a woken zombie meeting its fence: it wrote under its fenced generation,
        # or it tried to roll on and was refused. One that did neither showed nothing.
        self.happened = bool(wrote) or stopped
        zombie.fate = "fenced" if wrote or stopped else "replaced"
        end = "stopped itself: its roll was refused" if stopped else "then killed"
        self.note(f"zombie {zombie.name} wrote {wrote} records after SIGCONT, {end}")
        self.done = True


def refused_its_roll(zombie: Worker) -> bool:
    """Whether ``zombie`` stopped itself because its lease's roll was refused (``ProducerFenced``:
    its replacement had rolled the pid on): fenced, which is what a woken zombie should be."""
    return "ProducerFenced" in zombie.tail(20)


def lease_end_ms(worker: Worker) -> int:
    """The latest lease end (``expire_ms``) among the records ``worker`` got acknowledged."""
    worker.acked()
    return worker.lease_end_ms


@dataclass(eq=False)
class LeaseZombie(Takeover):
    """(f) A zombie that outlives its lease: SIGSTOP a producer, keep it stopped until the wall
    clock is past the end of every lease it wrote under, start its replacement from a copy of its
    checkpoint (the replacement follows the pid's lineage), wait until the replacement's FENCE
    records are acknowledged, then SIGCONT the old instance and let it run on its own.

    Every step waits for a fact (acknowledged records, the lease end read from the ledger, the
    replacement's FENCEs), never for a duration. The woken zombie must stop by itself: its lease
    is over and its roll is refused (``ProducerFenced``). A zombie that instead leases a fresh pid
    and re-sends its events is what the event-level checker reports as ``event_duplicate``.
    """

    name = "lease-zombie"

    margin_ms: int = 1000
    lease_end: int = field(default=0, init=False)

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (
            self._pause_when_due,
            self._replace_after_lease,
            self._wake_once_taken_over,
            self._await_zombie_exit,
        )

    def _pause_when_due(self) -> None:
        if not self._due():
            return
        zombie = self._freeze()
        self.lease_end = lease_end_ms(zombie)
        self._next(
            f"SIGSTOP {zombie.name} after {self.role.acked()} acknowledged records; "
            "its lease ends in "
            f"{max(0, self.lease_end - self.wall_ms()) / 1000:.1f} s"
        )

    def _replace_after_lease(self) -> None:
        if self.lease_end <= 0:
            raise ServiceFailed("lease-zombie: the ledger carries no lease end (expire_ms)")
        if self.wall_ms() < self.lease_end + self.margin_ms:
            return
        self.replacement = self.role.spawn_replacement()
        self._next(
            f"{self.zombie.name if self.zombie else '?'}'s lease has ended; replacement "
            f"{self.replacement.name} resumes from a copy of the checkpoint"
        )

    def _wake_once_taken_over(self) -> None:
        zombie, replacement = self._both()
        # The replacement has taken over once Kafka acknowledged something it wrote: a
        # FENCE when it continues the old pid's lineage, data under the successor pid.
        if replacement.fences() + replacement.acked() == 0:
            if not replacement.running:
                raise self._failed_before(replacement, "writing anything")
            return
        self._wake(
            zombie,
            f"SIGCONT {zombie.name} {(self.wall_ms() - self.lease_end) / 1000:.1f} s "
            f"after its lease ended; the replacement wrote {replacement.fences()} "
            f"FENCE(s) and {replacement.acked()} record(s)",
        )

    def _await_zombie_exit(self) -> None:
        zombie, _ = self._both()
        if zombie.running:
            return
        self.zombie_wrote = zombie.acked() - self._zombie_acked
        self.happened = True
        code = zombie.exit_code()
        fenced = refused_its_roll(zombie)
        zombie.fate = "fenced" if fenced else f"exited {code}"
        self.note(
            f"zombie {zombie.name} "
            + ("stopped itself: its roll was refused" if fenced else f"exited with {code}")
            + f" after writing {self.zombie_wrote} record(s) past its lease"
        )
        self.done = True


@dataclass(eq=False)
class CopierCrash(FaultScript):
    """(e) SIGKILL the copier once it has stored a checkpoint and got ``at`` records acknowledged;
    restart it: it resumes (bump + FENCE) and seeks upstream to the stored offsets."""

    name = "copier"

    start: Callable[[], Worker]
    state: Path
    at: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.instances: list[Worker] = [self.start()]

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (self._kill_and_restart,)

    def _kill_and_restart(self) -> None:
        current = self.instances[-1]
        if not self.state.exists() or current.acked() < self.at:
            if not current.running:
                self.note("copier finished before the kill point: nothing killed")
                self.done = True
            return
        current.kill()
        current.fate = "killed"
        self.happened = True
        self.note(f"SIGKILL {current.name} after {current.acked()} records, past its checkpoint")
        self.instances.append(self.start())
        self.note(f"restarted as {self.instances[-1].name} from {self.state.name}")
        self.done = True


@dataclass(eq=False)
class Bounce(FaultScript):
    """Kill a server once ``when()`` holds, keep it down ``down_s`` seconds, restart it.

    Used for a Kafka broker, a ZooKeeper node or a lease server (``kill``/``restart`` are the
    service's own fault hooks; ``restart`` may block until the server is ready).
    """

    #: field(): a required argument, not defaulting to FaultScript.name.
    name: str = field()
    when: Callable[[], bool]
    kill: Callable[[], None]
    restart: Callable[[], None]
    down_s: float = 3.0

    def _steps(self) -> Sequence[Callable[[], None]]:
        return (self._kill_when, self._restart_after_down)

    def _kill_when(self) -> None:
        if not self.when():
            return
        self.kill()
        self.happened = True
        self._next(f"killed {self.name}")

    def _restart_after_down(self) -> None:
        if self._waited() < self.down_s:
            return
        self.restart()
        self.note(f"restarted {self.name} after {self._waited():.1f}s down")
        self.done = True


__all__ = [
    "ZOMBIE_LEASE_LEFT",
    "Bounce",
    "CopierCrash",
    "FaultScript",
    "KillAndResume",
    "LeaseZombie",
    "ProducerFault",
    "Takeover",
    "Zombie",
    "drive",
    "lease_end_ms",
]
