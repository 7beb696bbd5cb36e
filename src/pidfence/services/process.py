"""A JVM (or any) server process started by pidfence, stopped by pid, with fault hooks."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pidfence.wire import PidfenceError

#: Every process this Python process started and has not stopped, by pid (the suite checks that
#: none runs at its end). Held as ``Popen`` objects: a process that exited on its own is asked
#: through its own handle, so a later process that reuses its pid is never taken for it.
_STARTED: dict[int, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()


class ServiceFailed(PidfenceError):
    """A service did not start or did not become ready; the message carries its log tail."""


def track(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Count a process started with ``subprocess.Popen`` among those :func:`started_pids`
    reports while it runs (the suite's check that nothing it started is left running)."""
    with _LOCK:
        _STARTED[proc.pid] = proc
    return proc


def started_pids() -> set[int]:
    """Pids of processes started here that are still running."""
    with _LOCK:
        return {pid for pid, proc in _STARTED.items() if proc.poll() is None}


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited, unreaped zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class ManagedProcess:
    """One server process: its command, its log file, and signals sent to its pid only."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def pid(self) -> int | None:
        """The running process's pid, if started."""
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Start the process, appending its output to ``log_path``."""
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} {self.name}\n".encode())
            log.flush()
            # Own session: a Ctrl-C in the terminal goes to pidfence, which stops us in order.
            self._proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                cwd=self.cwd,
                start_new_session=True,
            )
        with _LOCK:
            _STARTED[self._proc.pid] = self._proc
        self.paused = False

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The exit code once the process has exited."""
        return None if self._proc is None else self._proc.poll()

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the exit."""
        if self._proc is None:
            return
        self.terminate()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._proc.wait(10)
        self._forget()

    def terminate(self) -> None:
        """SIGTERM without waiting, then SIGCONT; :meth:`stop` then waits.

        SIGCONT always: a process can stop itself (a producer's ``--stop-after-checkpoint``), and
        a stopped process holds SIGTERM pending until it is continued.
        """
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL: a crash, no clean shutdown."""
        if self._proc is None:
            return
        if self.paused:
            self.resume()
        self._signal(signal.SIGKILL)
        self._proc.wait(10)
        self._forget()

    def pause(self) -> None:
        """SIGSTOP: the process freezes, its sockets stay open (a GC pause, a stuck VM)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def _forget(self) -> None:
        if self._proc is not None:
            with _LOCK:
                _STARTED.pop(self._proc.pid, None)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the process's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


#: Extra options for every JVM pidfence starts: ZooKeeper, Kafka, a Spark driver, executors and a
#: standalone cluster. The test suite sets ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``: its JVMs
#: live minutes on small data, where C2 compilation and a parallel collector cost more CPU than
#: they save (tests/README.md has the figures).
JVM_OPTIONS_ENV = "PIDFENCE_JVM_OPTIONS"


def jvm_options(default_gc: Sequence[str] = ()) -> list[str]:
    """``default_gc`` plus the options of :data:`JVM_OPTIONS_ENV`; a collector chosen there
    (``-XX:+Use...GC``) replaces ``default_gc``, since the JVM refuses two collectors."""
    extra = shlex.split(os.environ.get(JVM_OPTIONS_ENV, ""))
    chooses_gc = any(o.startswith("-XX:+Use") and o.endswith("GC") for o in extra)
    return [*(() if chooses_gc else default_gc), *extra]


def wait_until(
    check: object, timeout: float, what: str, interval: float = 0.2, tail: str = ""
) -> None:
    """Call ``check()`` until it returns truthy; :class:`ServiceFailed` after ``timeout``.

    A ``ServiceFailed`` raised by ``check`` itself (e.g. "the process exited") ends the wait at
    once: a dead server never becomes ready.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except ServiceFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any other probe failure means "not ready yet"
            last = exc
        time.sleep(interval)
    detail = f" (last error: {last})" if last else ""
    raise ServiceFailed(f"{what} not ready after {timeout:.0f}s{detail}\n{tail}")


class RunsProcess:
    """For a wrapper of one :class:`ManagedProcess` (its ``proc``): its pid, state and fault
    hooks, delegated."""

    proc: ManagedProcess

    @property
    def pid(self) -> int | None:
        """The OS pid while running."""
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True until the process exits."""
        return self.proc.running

    def exit_code(self) -> int | None:
        """The exit code once exited."""
        return self.proc.exit_code()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.proc.kill()

    def pause(self) -> None:
        """SIGSTOP: frozen, sockets open (a zombie-to-be)."""
        self.proc.pause()

    def resume(self) -> None:
        """SIGCONT."""
        self.proc.resume()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        self.proc.stop(timeout)
