"""The process behind ``pidfence lease-server``: logs, metrics endpoint, signals, shutdown.

Startup failures are raised as ``PidfenceError`` (after one log line); ``pidfence.cli.lease`` maps
them to exit codes with the table every command uses.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import start_http_server

from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.loops import loop_factory
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.runtime import start_server
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.settings_sources import host_port
from pidfence.wire import PidfenceError

log = logging.getLogger("pidfence.lease_server")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with any ``extra=`` fields."""

    _PLAIN = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON."""
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._PLAIN})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: str) -> None:
    """Log to stderr as JSON lines or text."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("kazoo").setLevel(logging.WARNING)


def write_ready_file(path: Path, address: str) -> None:
    """Write ``address`` to ``path`` atomically; no temporary file is left behind on failure.

    Raises:
        OSError: the directory cannot be written (the caller reports it).
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(address)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def serve_forever(settings: LeaseServerSettings) -> None:
    """Run until SIGTERM/SIGINT.

    Raises:
        SettingsError, SecretFileError, KeyFileError, LoopUnavailable: a setting or file is bad.
        LeaseServiceUnavailable: ZooKeeper is unreachable at start.
    """
    configure_logging(settings.log_format)
    try:
        factory, loop_name = loop_factory(settings.event_loop)
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(settings, loop_name))
    except PidfenceError as exc:
        log.error("startup failed: %s", exc)
        raise


def _serve_metrics(settings: LeaseServerSettings, metrics: ServerMetrics) -> None:
    if settings.metrics_port is None:
        return
    try:
        start_http_server(
            settings.metrics_port, addr=settings.metrics_host, registry=metrics.registry
        )
    except OSError as exc:
        raise SettingsError(
            f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
            f"{exc.strerror or exc}; pick another --metrics-port"
        ) from None


async def _serve(settings: LeaseServerSettings, loop_name: str) -> None:
    metrics = ServerMetrics()
    _serve_metrics(settings, metrics)
    running = await start_server(None, settings, metrics=metrics)
    # Everything allocated so far (the lease ring's million-slot lists, kazoo, the imports) lives
    # as long as the process: out of the collector's sight, a full collection no longer walks it
    # (~50 ms each under load, and every request in flight waited for it).
    gc.collect()
    gc.freeze()
    metrics.watch_gc()
    address = host_port(running.host, running.port)
    log.info(
        "listening on %s",
        address,
        extra={
            "address": address,
            "server_id": running.service.server_id,
            "auth": settings.auth_tokens_file is not None,
            "tls": settings.tls_cert is not None,
            "mutual_tls": settings.tls_client_ca is not None,
            "signing": settings.signing_key is not None,
            "record_mac": settings.record_mac_secret is not None,
            "insecure": settings.insecure,
            "zk_acl": settings.zk_auth_file is not None,
            "metrics": None
            if settings.metrics_port is None
            else host_port(settings.metrics_host, settings.metrics_port),
            "loop": loop_name,
        },
    )
    if settings.ready_file is not None:
        try:
            write_ready_file(settings.ready_file, address)
        except OSError as exc:
            await running.close()
            raise SettingsError(f"cannot write ready file {settings.ready_file}: {exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    started = time.monotonic()
    await running.close()
    service = running.service
    log.info(
        "stopped",
        extra={
            "leases": service.leases,
            "bumps": service.bumps,
            "rolls": service.rolls,
            "blocks_claimed": service.supply.blocks_claimed,
            "shutdown_s": round(time.monotonic() - started, 3),
        },
    )
