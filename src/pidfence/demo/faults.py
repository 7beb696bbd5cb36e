"""Fault scripts: small state machines polled by one loop, so faults overlap like real ones.

Each script's :meth:`FaultScript.poll` advances it by at most one step and never blocks for long;
:func:`drive` polls every unfinished script (plus any callback, e.g. a progress bar) until all
are done. The demo and the chaos tests run the same scripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pidfence.demo.procs import ProducerRole, Worker
from pidfence.services.process import ServiceFailed


class FaultScript:
    """Base of the fault scripts: ``done``, a log of what happened, and ``poll()``."""

    name = "fault"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.done = False
        self.events: list[str] = []
        self._step = 0
        self._since = clock()

    def note(self, text: str) -> None:
        """Record an event (shown by the demo, asserted by tests)."""
        self.events.append(text)

    def _next(self) -> None:
        self._step += 1
        self._since = self.clock()

    def _waited(self) -> float:
        return self.clock() - self._since

    def poll(self) -> None:
        """Advance by at most one step."""
        raise NotImplementedError


class KillAndResume(FaultScript):
    """(a) SIGKILL a producer once it has ``at`` records acknowledged; restart it from ``--state``.

    The restarted instance resumes from the last checkpoint: it bumps the generation and writes
    a FENCE to every partition, then re-sends what followed the checkpoint (DUPLICATE verdicts).
    """

    name = "kill"

    def __init__(
        self, role: ProducerRole, at: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(clock)
        self.role = role
        self.at = at

    def poll(self) -> None:
        if self.done:
            return
        if self._step == 0:
            if self.role.acked() < self.at or self.role.checkpointed() == 0:
                return
            victim = self.role.current
            victim.kill()
            victim.fate = "killed"
            self.note(f"SIGKILL {victim.name} after {self.role.acked()} acknowledged records")
            self._next()
        elif self._step == 1:
            worker = self.role.spawn()
            self.note(f"restarted as {worker.name} from {self.role.spec.state.name}")
            self.done = True


class Zombie(FaultScript):
    """(b) SIGSTOP a producer, start its replacement from a copy of its checkpoint, wait until the
    replacement's FENCE records are acknowledged, SIGCONT the old instance and let it write with
    its fenced generation for ``zombie_records`` records (or ``zombie_s`` seconds), then SIGKILL it.

    The zombie is killed in the end because, left alone, it would roll its lease over to a fresh
    pid and become a legitimate producer again (nothing tells a producer it was fenced).
    """

    name = "zombie"

    def __init__(
        self,
        role: ProducerRole,
        at: int,
        zombie_records: int = 50,
        zombie_s: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.role = role
        self.at = at
        self.zombie_records = zombie_records
        self.zombie_s = zombie_s
        self.zombie: Worker | None = None
        self.replacement: Worker | None = None
        self._zombie_acked = 0
        #: Records the zombie got acknowledged after SIGCONT (its fenced writes).
        self.zombie_wrote = 0

    def poll(self) -> None:
        if self.done:
            return
        if self._step == 0:
            if self.role.acked() < self.at or self.role.checkpointed() == 0:
                return
            self.zombie = self.role.current
            self.zombie.pause()
            self.zombie.fate = "replaced"
            self.note(f"SIGSTOP {self.zombie.name} after {self.role.acked()} acknowledged records")
            self._next()
        elif self._step == 1:
            self.replacement = self.role.spawn_replacement()
            self.note(f"replacement {self.replacement.name} resumes from a copy of the checkpoint")
            self._next()
        elif self._step == 2:
            if self.replacement is None or self.zombie is None:
                raise RuntimeError("zombie script lost its processes")
            if self.replacement.fences() == 0 or self.replacement.acked() == 0:
                if not self.replacement.running and self.replacement.fences() == 0:
                    raise ServiceFailed(
                        f"replacement {self.replacement.name} exited before fencing:\n"
                        + self.replacement.tail()
                    )
                return
            self._zombie_acked = self.zombie.acked()
            self.zombie.resume()
            self.note(
                f"SIGCONT {self.zombie.name}: replacement fenced "
                f"{self.replacement.fences()} partition(s) and wrote {self.replacement.acked()}"
            )
            self._next()
        elif self._step == 3:
            if self.zombie is None:
                raise RuntimeError("zombie script lost its process")
            wrote = self.zombie.acked() - self._zombie_acked
            if (
                wrote < self.zombie_records
                and self._waited() < self.zombie_s
                and self.zombie.running
            ):
                return
            self.zombie.kill()
            self.zombie_wrote = wrote
            self.zombie.fate = "fenced" if wrote else "replaced"
            self.note(f"zombie {self.zombie.name} wrote {wrote} records after SIGCONT, then killed")
            self.done = True


class CopierCrash(FaultScript):
    """(e) SIGKILL the copier once it has stored a checkpoint and run ``after_s`` seconds more;
    restart it: it resumes (bump + FENCE) and seeks upstream to the stored offsets."""

    name = "copier"

    def __init__(
        self,
        start: Callable[[], Worker],
        state: Path,
        after_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.start = start
        self.state = state
        self.after_s = after_s
        self.instances: list[Worker] = [start()]

    def poll(self) -> None:
        if self.done:
            return
        current = self.instances[-1]
        if self._step == 0:
            if not self.state.exists():
                if not current.running:
                    self.note("copier finished before its first checkpoint: nothing to kill")
                    self.done = True
                return
            self._next()
        elif self._step == 1:
            if self._waited() < self.after_s:
                return
            if not current.running:
                self.note("copier finished before the kill point: nothing to kill")
                self.done = True
                return
            current.kill()
            current.fate = "killed"
            self.note(f"SIGKILL {current.name} after its checkpoint")
            self.instances.append(self.start())
            self.note(f"restarted as {self.instances[-1].name} from {self.state.name}")
            self.done = True


class Bounce(FaultScript):
    """Kill a server once ``when()`` holds, keep it down ``down_s`` seconds, restart it.

    Used for a Kafka broker, a ZooKeeper node or a lease server (``kill``/``restart`` are the
    service's own fault hooks; ``restart`` may block until the server is ready).
    """

    def __init__(
        self,
        name: str,
        when: Callable[[], bool],
        kill: Callable[[], None],
        restart: Callable[[], None],
        down_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock)
        self.name = name
        self.when = when
        self.kill = kill
        self.restart = restart
        self.down_s = down_s

    def poll(self) -> None:
        if self.done:
            return
        if self._step == 0:
            if not self.when():
                return
            self.kill()
            self.note(f"killed {self.name}")
            self._next()
        elif self._step == 1 and self._waited() >= self.down_s:
            self.restart()
            self.note(f"restarted {self.name} after {self._waited():.1f}s down")
            self.done = True


def drive(
    scripts: Sequence[FaultScript],
    timeout: float,
    tick: Callable[[], None] | None = None,
    until: Callable[[], bool] | None = None,
    interval: float = 0.25,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll ``scripts`` (and ``tick``) until all are done and ``until()`` holds.

    Raises:
        ServiceFailed: after ``timeout`` seconds, naming the scripts still pending.
    """
    deadline = clock() + timeout
    while True:
        for script in scripts:
            script.poll()
        if tick is not None:
            tick()
        if all(s.done for s in scripts) and (until is None or until()):
            return
        if clock() > deadline:
            pending = [s.name for s in scripts if not s.done]
            raise ServiceFailed(
                f"demo steps not finished after {timeout:.0f}s "
                f"(pending faults: {pending or 'none'})"
            )
        sleep(interval)
