"""Running a lease server: in a thread (tests, demo) or as a subprocess (chaos tests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pidfence.pid_allocator.coordinator import Coordinator
from pidfence.pid_allocator.errors import LeaseServerUnreachable
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.server import LeaseServer, ServerLimits
from pidfence.pid_allocator.service import (
    DEFAULT_BLOCK_TTL_MS,
    DEFAULT_LIFETIME_MS,
    LeaseService,
    ServiceConfig,
    wall_clock_ms,
)
from pidfence.pid_allocator.zk_blocks import ZkCoordinator


@dataclass
class RunningServer:
    """The parts of a started server, for its owner to stop."""

    server: LeaseServer
    coordinator: Coordinator
    executor: ThreadPoolExecutor
    host: str
    port: int

    async def close(self) -> None:
        """Stop serving, then release ZooKeeper and the executor."""
        await self.server.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.coordinator.close()


async def start_server(
    zk_hosts: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: ServiceConfig | None = None,
    limits: ServerLimits | None = None,
    metrics: ServerMetrics | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    coordinator: Coordinator | None = None,
    zk_root: str = "/pidfence",
    zk_session_timeout_s: float = 10.0,
) -> RunningServer:
    """Connect to ZooKeeper (off the loop) and start listening.

    Raises:
        LeaseServiceUnavailable: ZooKeeper cannot be reached.
    """
    if coordinator is None and not zk_hosts:
        raise ValueError("give zk_hosts (ZooKeeper connect string) or a coordinator")
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lease-zk")
    owned: Coordinator | None = None
    try:
        if coordinator is None:
            zk = ZkCoordinator(str(zk_hosts), root=zk_root, session_timeout_s=zk_session_timeout_s)
            coordinator = owned = await asyncio.get_running_loop().run_in_executor(
                executor, zk.start
            )
        service = LeaseService(coordinator, executor, config, clock=clock)
        server = LeaseServer(service, metrics, limits)
        bound_host, bound_port = await server.start(host, port)
    except BaseException:
        executor.shutdown(wait=False, cancel_futures=True)
        if owned is not None:
            owned.close()
        raise
    return RunningServer(server, coordinator, executor, bound_host, bound_port)


class LeaseServerThread:
    """A lease server on its own event loop thread, for tests and the demo.

    Args:
        zk_hosts: ZooKeeper connect string (may include a chroot); None with ``coordinator``.
        host: listen address.
        port: listen port (0 = any free port).
        block_size: pids per ZooKeeper claim.
        lifetime_ms: lease lifetime.
        capacity: lease ring size.
        clock: epoch-ms clock.
        block_ttl_ms: how long a claimed block is issued from.
        limits: connection limits.
        coordinator: a ready coordinator instead of ZooKeeper (e.g. ``MemoryCoordinator``).
        zk_session_timeout_s: ZooKeeper session timeout (short in fault tests).
    """

    def __init__(
        self,
        zk_hosts: str | None,
        host: str = "127.0.0.1",
        port: int = 0,
        block_size: int = 100,
        lifetime_ms: int = DEFAULT_LIFETIME_MS,
        capacity: int = 100_000,
        clock: Callable[[], int] = wall_clock_ms,
        *,
        block_ttl_ms: int = DEFAULT_BLOCK_TTL_MS,
        limits: ServerLimits | None = None,
        coordinator: Coordinator | None = None,
        zk_session_timeout_s: float = 10.0,
    ) -> None:
        self.zk_hosts = zk_hosts
        self._zk_session_timeout_s = zk_session_timeout_s
        self._host = host
        self._port = port
        self.config = ServiceConfig(
            block_size=block_size,
            lifetime_ms=lifetime_ms,
            capacity=capacity,
            block_ttl_ms=block_ttl_ms,
        )
        self._clock = clock
        self._limits = limits
        self._coordinator = coordinator
        self.metrics = ServerMetrics()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: RunningServer | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        """``"host:port"`` once started."""
        if self._running is None:
            raise RuntimeError("server not started")
        return f"{self._running.host}:{self._running.port}"

    @property
    def running(self) -> RunningServer:
        """The started server's parts (service, coordinator) for inspection."""
        if self._running is None:
            raise RuntimeError("server not started")
        return self._running

    def start(self, timeout_s: float = 30.0) -> LeaseServerThread:
        """Start and return once listening; re-raise a startup error."""
        self._thread = threading.Thread(target=self._run, name="lease-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise LeaseServerUnreachable(f"lease server did not start within {timeout_s}s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            self._running = await start_server(
                self.zk_hosts,
                host=self._host,
                port=self._port,
                config=self.config,
                limits=self._limits,
                metrics=self.metrics,
                clock=self._clock,
                coordinator=self._coordinator,
                zk_session_timeout_s=self._zk_session_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - handed to start()'s caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self._running.close()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> LeaseServerThread:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class SpawnedLeaseServer:
    """A ``pidfence lease-server`` subprocess."""

    def __init__(self, process: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.process = process
        self.address = address
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """Process id."""
        return self.process.pid

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, wait, SIGKILL if needed; return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""


def spawn_lease_server(
    zk_hosts: str,
    *,
    block_size: int = 100,
    lifetime: str = "24h",
    capacity: int = 100_000,
    metrics_port: int | None = None,
    run_dir: Path | None = None,
    timeout_s: float = 60.0,
) -> SpawnedLeaseServer:
    """Start ``pidfence lease-server`` on a free port; return once it listens.

    Raises:
        LeaseServerUnreachable: it exited or did not listen within ``timeout_s`` (log included).
    """
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="pidfence-lease-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="ready-", dir=run_dir)
    os.close(fd)
    ready = Path(name)
    ready.unlink()
    log_path = ready.with_name(ready.name.replace("ready-", "log-") + ".log")
    cmd = [
        sys.executable, "-c", "from pidfence.cli import main; main()", "lease-server",
        "--zk", zk_hosts, "--listen", "127.0.0.1:0", "--block-size", str(block_size),
        "--lifetime", lifetime, "--capacity", str(capacity), "--ready-file", str(ready),
        "--log-format", "json",
    ]  # fmt: skip
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    handle = SpawnedLeaseServer(process, "", log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            handle.address = ready.read_text().strip()
            return handle
        if process.poll() is not None:
            break
        time.sleep(0.05)
    handle.kill()
    raise LeaseServerUnreachable(
        f"pidfence lease-server did not start (exit {process.returncode}):\n{handle.log_tail()}"
    )
