"""A supervisor for processes that exit 75 (retriable): start them again, as an operator would.

``pidfence produce``, ``copy`` and ``sink`` exit 75 when a retry may succeed (a lease server or
Kafka unreachable for too long); the nemesis expects that and restarts them, and records every
exit so a test can judge it (no other non-zero exit, no hang after the network heals).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pidfence.services.process import ServiceFailed
from pidfence.testing.script import FaultScript

#: Exit code of a retriable failure (EX_TEMPFAIL).
EXIT_RETRIABLE = 75


class Supervised(Protocol):
    """What the supervisor needs of a process."""

    name: str

    @property
    def running(self) -> bool:
        """True until it exits."""

    def exit_code(self) -> int | None:
        """Its exit code once exited."""


@dataclass(eq=False)
class Supervisor(FaultScript):
    """Watch the process ``current()`` returns; restart it with ``restart()`` after exit 75.

    Done when the current instance exited 0. Any other exit raises :class:`ServiceFailed`, except
    for an instance a fault script ended on purpose (its ``fate`` is set, e.g. ``killed``): that
    script starts the next instance itself.

    Args:
        name: what it supervises (for events).
        current: the newest instance.
        restart: start a new instance (it becomes ``current()``).
        max_restarts: give up (ServiceFailed) after this many restarts.
        backoff_s: wait this long after an exit 75 before the restart.
        clock: monotonic seconds.
    """

    #: field(): a required argument, not defaulting to FaultScript.name.
    name: str = field()
    current: Callable[[], Supervised]
    restart: Callable[[], object]
    max_restarts: int = 20
    backoff_s: float = 1.0
    restarts: int = field(default=0, init=False)
    #: (instance name, exit code) of every exit seen.
    exits: list[tuple[str, int]] = field(default_factory=list, init=False)
    _seen: Supervised | None = field(default=None, init=False)
    _exited_at: float = field(default=0.0, init=False)

    @property
    def pending(self) -> bool:
        """True while the current instance has exited 75 and is not restarted yet, whether or not
        :meth:`poll` has seen the exit (a caller that blocked, e.g. on a sink pass, must still
        wait for the restart)."""
        if self.done:
            return False
        proc = self.current()
        return not proc.running and proc.exit_code() == EXIT_RETRIABLE

    def poll(self) -> None:
        if self.done:
            return
        proc = self.current()
        code = None if proc.running else proc.exit_code()
        if code is None or getattr(proc, "fate", None) is not None:
            return
        if proc is not self._seen:
            self._seen, self._exited_at = proc, self.clock()
            self.exits.append((proc.name, code))
            if code == 0:
                self.note(f"{proc.name} finished")
                self.done = True
            elif code != EXIT_RETRIABLE:
                raise ServiceFailed(f"{proc.name} exited with {code} (not 0 or 75)")
            return
        if self.clock() - self._exited_at < self.backoff_s:
            return
        if self.restarts >= self.max_restarts:
            raise ServiceFailed(f"{self.name}: still exiting 75 after {self.restarts} restarts")
        self.restarts += 1
        self.happened = True
        self.note(f"{proc.name} exited 75 (retriable): restart {self.restarts}")
        self.restart()
