"""Fault scripts: small state machines polled by one loop, so faults overlap like real ones.

Each script's :meth:`FaultScript.poll` advances it by at most one step and never blocks for long;
:func:`drive` polls every unfinished script (plus any callback, e.g. a progress bar) until all
are done. The demo, the chaos tests and the network nemesis run the same scripts; the concrete
producer scripts live in :mod:`pidfence.demo.faults`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pidfence.services.process import ServiceFailed


@dataclass(eq=False)
class FaultScript:
    """Base of the fault scripts: ``done``, a log of what happened, and ``poll()``.

    Its subclasses are dataclasses too; ``clock`` (monotonic seconds) is keyword-only, so it
    comes after each subclass's own arguments.
    """

    name = "fault"

    clock: Callable[[], float] = field(default=time.monotonic, kw_only=True)
    done: bool = field(default=False, init=False)
    #: True once the fault's action really happened (a test asserts it, so a run where the
    #: victim finished first cannot pass by luck).
    happened: bool = field(default=False, init=False)
    events: list[str] = field(default_factory=list, init=False)
    _step: int = field(default=0, init=False)
    _since: float = field(init=False)

    def __post_init__(self) -> None:
        self._since = self.clock()

    def note(self, text: str) -> None:
        """Record an event (shown by the demo, asserted by tests)."""
        self.events.append(text)

    def _next(self, event: str | None = None) -> None:
        """Move on to the next step, first noting ``event`` (what this step did) if given."""
        if event is not None:
            self.note(event)
        self._step += 1
        self._since = self.clock()

    def _waited(self) -> float:
        return self.clock() - self._since

    def poll(self) -> None:
        """Advance by at most one step: run the current one of :meth:`_steps`."""
        if not self.done:
            self._steps()[self._step]()

    def _steps(self) -> Sequence[Callable[[], None]]:
        """The script's steps in order. Each returns soon: it waits by returning, moves on with
        ``_next()``, or ends the script by setting ``done``. Scripts that override
        :meth:`poll` need none."""
        raise NotImplementedError


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
                f"fault steps not finished after {timeout:.0f}s "
                f"(pending faults: {pending or 'none'})"
            )
        sleep(interval)
