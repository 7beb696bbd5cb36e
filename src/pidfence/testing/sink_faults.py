"""The sink's fault hook: SIGKILL the sink's process group at a crash point, hold the sink at a
point while a test breaks something else (the store, the network), fail a task attempt.

:class:`SinkFaults` says what to do; :meth:`SinkFaults.install` puts its hook into
:mod:`pidfence.spark_sink.crash_points` in this process. The sink's executors and its commit
runner are other Python processes that Spark starts: :mod:`pidfence.testing.spark_python`
installs the same hook there (``python -m pidfence.testing.run`` arranges both).

A crash kills the whole process group of the sink's driver (its JVM and the Python workers die
with it, like a lost machine). It fires only in a process that belongs to that driver's group or
session, so a stray hook can never kill anything else.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from pidfence.spark_sink import crash_points
from pidfence.spark_sink.errors import SinkError
from pidfence.wire import PidfenceError


class InjectedFault(SinkError):
    """A task failure injected on purpose (a retry succeeds)."""

    retriable: ClassVar[bool] = True


class BadSinkFault(PidfenceError):
    """A sink fault names an unknown crash point or no process group to kill."""


@dataclass(frozen=True)
class SinkFaults:
    """What the sink's fault hook does.

    Args:
        crash_at: SIGKILL the sink's process group at this point (one of
            :data:`pidfence.spark_sink.crash_points.POINTS`), or None.
        group: the process group (the driver's pid when it leads its session) that dies.
        fail_first_attempt: every task's first attempt raises :class:`InjectedFault` at
            ``task_start`` (Spark retries it; run with a master such as ``local[2,3]``).
        hold_at: the first process to reach this point waits there (:func:`hold`), in
            ``hold_dir``, until the test releases it.
        hold_dir: the folder of that rendezvous.
    """

    crash_at: str | None = None
    group: int | None = None
    fail_first_attempt: bool = False
    hold_at: str | None = None
    hold_dir: str | None = None

    def __post_init__(self) -> None:
        for point in (self.crash_at, self.hold_at):
            if point is not None and point not in crash_points.POINTS:
                points = ", ".join(crash_points.POINTS)
                raise BadSinkFault(f"unknown crash point {point!r}: use one of {points}")
        if self.crash_at is not None and (self.group is None or self.group <= 0):
            raise BadSinkFault(f"crash at {self.crash_at} needs the sink's process group")
        if self.hold_at is not None and self.hold_dir is None:
            raise BadSinkFault(f"hold at {self.hold_at} needs a folder to meet the test in")

    @property
    def active(self) -> bool:
        """True when the hook does anything."""
        return self.crash_at is not None or self.fail_first_attempt or self.hold_at is not None

    def hook(self, point: str, attempt: int) -> None:
        """The hook installed into :mod:`pidfence.spark_sink.crash_points`."""
        if self.fail_first_attempt and point == "task_start" and attempt == 0:
            raise InjectedFault(f"injected failure of task attempt {attempt} (a retry passes)")
        if point == self.crash_at and self.group is not None:
            kill_group(self.group)
        if point == self.hold_at and self.hold_dir is not None:
            hold(Path(self.hold_dir))

    def install(self) -> None:
        """Install the hook in this process (replacing any other)."""
        crash_points.install_hook(self.hook if self.active else None)

    def to_json(self) -> str:
        """The settings as one JSON line (passed to the Python processes Spark starts)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SinkFaults:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        return cls(
            crash_at=data.get("crash_at"),
            group=data.get("group"),
            fail_first_attempt=bool(data.get("fail_first_attempt")),
            hold_at=data.get("hold_at"),
            hold_dir=data.get("hold_dir"),
        )


#: The files of a hold's rendezvous: the sink made ``HELD``, the test makes ``RELEASE``.
HELD, RELEASE = "held", "release"


def hold(folder: Path, poll_s: float = 0.05, limit_s: float = 900.0) -> None:
    """The first caller (of any process) creates ``folder/held`` and waits until
    ``folder/release`` exists; later callers pass at once. A test that sees ``held`` knows the
    sink is at the point, breaks what it wants, then creates ``release``.

    Raises:
        TimeoutError: nothing released it within ``limit_s`` (a test that died meanwhile): the
            sink fails instead of waiting forever.
    """
    try:
        (folder / HELD).touch(exist_ok=False)
    except FileExistsError:
        return
    deadline = time.monotonic() + limit_s
    while not (folder / RELEASE).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"held at {folder} for {limit_s:.0f} s: nobody released it")
        time.sleep(poll_s)


def kill_group(leader: int) -> None:
    """SIGKILL ``leader``'s process group, and this process's own group, if this process belongs
    to that group or session; otherwise do nothing.

    PySpark's daemon puts its Python workers in a group of their own (``setpgid``), still inside
    the driver's session: a worker fires when the driver it belongs to leads that session.
    """
    if leader not in (os.getpgrp(), os.getsid(0)):
        return
    own = os.getpgrp()
    if own != leader:
        os.killpg(leader, signal.SIGKILL)
    os.killpg(own, signal.SIGKILL)


def lead_own_session() -> int:
    """Make this process the leader of a session of its own (if it is not already); its pid.

    Raises:
        BadSinkFault: it leads a process group but not a session (``setsid`` refuses).
    """
    pid = os.getpid()
    if os.getsid(0) == pid:
        return pid
    try:
        os.setsid()
    except PermissionError as exc:
        raise BadSinkFault(
            "cannot crash the sink's process group: this process leads a process group but not "
            "its session; start it with start_new_session=True"
        ) from exc
    return pid
