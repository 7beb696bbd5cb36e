"""Running a lease server in-process: ``start_server`` (any event loop) and
``LeaseServerThread`` (its own loop thread, for tests and the demo).

A lease server as a separate process is started with ``pidfence lease-server`` (``daemon``);
tests and the demo spawn it through ``pidfence.services.lease_server.spawn_lease_server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from pidfence.lifecycle import Startable
from pidfence.pid_allocator.coordinator import Coordinator
from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.errors import LeaseServerUnreachable
from pidfence.pid_allocator.loops import loop_factory
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.security import (
    load_auth_tokens,
    load_zk_auth,
    server_tls_context,
)
from pidfence.pid_allocator.server import LeaseServer
from pidfence.pid_allocator.service import LeaseService
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.settings_sources import host_port
from pidfence.pid_allocator.zookeeper import ZkCoordinator
from pidfence.wire import PidfenceError
from pidfence.wire.cert import load_private_key
from pidfence.wire.mac import load_mac_secret

log = logging.getLogger(__name__)
T = TypeVar("T")


class ServerNotStarted(PidfenceError, RuntimeError):
    """A ``LeaseServerThread`` was asked for its address or parts before ``start()``."""


def _started(part: T | None) -> T:
    if part is None:
        raise ServerNotStarted("the lease server is not started; call start() first")
    return part


@dataclass
class RunningServer:
    """The parts of a started server, for its owner to stop."""

    server: LeaseServer
    coordinator: Coordinator
    executors: list[ThreadPoolExecutor]
    host: str
    port: int
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def service(self) -> LeaseService:
        """The lease logic."""
        return self.server.service

    async def close(self) -> None:
        """Stop serving, then release ZooKeeper and the executors."""
        for task in self.tasks:
            task.cancel()
        await self.server.close()
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)
        self.coordinator.close()


async def _collect_garbage(service: LeaseService, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            deleted = await service.collect_garbage()
        except Exception as exc:  # noqa: BLE001 - GC retries next round; serving goes on
            log.warning("garbage collection failed: %s", exc)
            continue
        if deleted:
            log.info("garbage collection deleted %d records", deleted, extra={"deleted": deleted})


async def start_server(
    zk_hosts: str | None,
    settings: LeaseServerSettings | None = None,
    *,
    metrics: ServerMetrics | None = None,
    clock: Callable[[], int] | None = None,
    coordinator: Coordinator | None = None,
) -> RunningServer:
    """Load the secrets ``settings`` name, connect to ZooKeeper (off the loop), listen.

    Args:
        zk_hosts: ZooKeeper connect string (None: ``settings.zk_hosts``).
        settings: the server's settings.
        metrics: where counters go.
        clock: epoch-ms clock (default: a steady clock).
        coordinator: a ready coordinator instead of ZooKeeper.

    Raises:
        SettingsError: no ZooKeeper connect string and no coordinator.
        LeaseServiceUnavailable: ZooKeeper cannot be reached.
        SecretFileError, KeyFileError: a token, key, secret or certificate file is bad.
    """
    settings = settings or LeaseServerSettings()
    zk_hosts = zk_hosts or settings.zk_hosts
    if coordinator is None and not zk_hosts:
        raise SettingsError("give --zk (the ZooKeeper connect string), or a coordinator")
    tokens = (
        None if settings.auth_tokens_file is None else load_auth_tokens(settings.auth_tokens_file)
    )
    tls = (
        None
        if settings.tls_cert is None or settings.tls_key is None
        else server_tls_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    )
    signing_key = None if settings.signing_key is None else load_private_key(settings.signing_key)
    mac_secret = (
        None if settings.record_mac_secret is None else load_mac_secret(settings.record_mac_secret)
    )
    zk_auth = None if settings.zk_auth_file is None else load_zk_auth(settings.zk_auth_file)
    # One thread more than --zk-workers: the fair queue's reserve (zk_queue.py) for clients with
    # nothing running.
    executor = ThreadPoolExecutor(
        max_workers=settings.zk_workers + 1, thread_name_prefix="lease-zk"
    )
    claims = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-claim")
    # Garbage collection reads every record once: its own thread, so claims never queue behind it.
    collector = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-gc")
    owned: Coordinator | None = None
    try:
        if coordinator is None:
            zk = ZkCoordinator(
                str(zk_hosts),
                root=settings.zk_root,
                session_timeout_s=settings.zk_session_timeout_s,
                op_timeout_s=settings.zk_op_timeout_s,
                auth=zk_auth,
            )
            coordinator = owned = await asyncio.get_running_loop().run_in_executor(claims, zk.start)
        service = LeaseService(
            coordinator,
            executor,
            settings,
            clock=clock,
            signing_key=signing_key,
            claim_executor=claims,
            mac_secret=mac_secret,
            gc_executor=collector,
        )
        server = LeaseServer(service, metrics, tokens, tls)
        try:
            bound_host, bound_port = await server.start(settings.host, settings.port)
        except OSError as exc:  # the address is taken, or not this machine's
            raise SettingsError(
                f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}; "
                "pick another --listen"
            ) from None
    except BaseException:
        executor.shutdown(wait=False, cancel_futures=True)
        claims.shutdown(wait=False, cancel_futures=True)
        collector.shutdown(wait=False, cancel_futures=True)
        if owned is not None:
            owned.close()
        raise
    running = RunningServer(
        server, coordinator, [executor, claims, collector], bound_host, bound_port
    )
    if settings.gc_interval_s > 0:
        running.tasks.append(
            asyncio.get_running_loop().create_task(
                _collect_garbage(service, settings.gc_interval_s)
            )
        )
    return running


class LeaseServerThread(Startable):
    """A lease server on its own event loop thread, for tests and the demo.

    Args:
        zk_hosts: ZooKeeper connect string (may include a chroot); None with ``coordinator``.
        settings: the server's settings (default: ``LeaseServerSettings(port=0)``).
        clock: epoch-ms clock (default: a steady clock).
        coordinator: a ready coordinator instead of ZooKeeper (e.g. ``MemoryCoordinator``).
        **overrides: settings fields to change, e.g. ``block_size=20, lifetime_ms=60_000``.
    """

    def __init__(
        self,
        zk_hosts: str | None,
        settings: LeaseServerSettings | None = None,
        *,
        clock: Callable[[], int] | None = None,
        coordinator: Coordinator | None = None,
        **overrides: Any,
    ) -> None:
        self.zk_hosts = zk_hosts
        self.settings = (settings or LeaseServerSettings(port=0)).with_overrides(**overrides)
        self._clock = clock
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
        """``"host:port"`` once started (an IPv6 host in brackets)."""
        return host_port(self.running.host, self.running.port)

    @property
    def running(self) -> RunningServer:
        """The started server's parts (service, coordinator) for inspection."""
        return _started(self._running)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The server's event loop (to run checks on it with ``call_soon_threadsafe``)."""
        return _started(self._loop)

    def start(self, timeout_s: float = 30.0) -> Self:
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
        try:
            factory, _ = loop_factory(self.settings.event_loop)
        except Exception as exc:  # noqa: BLE001 - handed to start()'s caller
            self._error = exc
            self._ready.set()
            return
        loop = factory()
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
                self.settings,
                metrics=self.metrics,
                clock=self._clock,
                coordinator=self._coordinator,
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
