"""The process behind ``pidfence lease-server``: logs, metrics endpoint, signals, shutdown."""

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

from pidfence.pid_allocator.errors import LeaseServiceUnavailable
from pidfence.pid_allocator.loops import loop_factory
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.runtime import start_server
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.wire import PidfenceError

log = logging.getLogger("pidfence.lease_server")

#: Exit codes: 0 clean stop, 2 bad configuration (a file), 3 ZooKeeper unreachable at start.
EXIT_CONFIG = 2
EXIT_ZOOKEEPER = 3


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


def serve_forever(zk_hosts: str, settings: LeaseServerSettings) -> int:
    """Run until SIGTERM/SIGINT; return the exit code (0 clean, 2 bad file, 3 ZooKeeper)."""
    configure_logging(settings.log_format)
    try:
        factory, loop_name = loop_factory(settings.event_loop)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_serve(zk_hosts, settings, loop_name))
    except LeaseServiceUnavailable as exc:
        log.error("startup failed: %s", exc)
        return EXIT_ZOOKEEPER
    except PidfenceError as exc:
        log.error("startup failed: %s", exc)
        return EXIT_CONFIG


async def _serve(zk_hosts: str, settings: LeaseServerSettings, loop_name: str) -> int:
    metrics = ServerMetrics()
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr=settings.host, registry=metrics.registry)
    running = await start_server(zk_hosts, settings, metrics=metrics)
    # Everything allocated so far (the lease ring's million-slot lists, kazoo, the imports) lives
    # as long as the process: out of the collector's sight, a full collection no longer walks it
    # (~50 ms each under load, and every request in flight waited for it).
    gc.collect()
    gc.freeze()
    metrics.watch_gc()
    address = f"{running.host}:{running.port}"
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
            "zk_acl": settings.zk_auth_file is not None,
            "loop": loop_name,
        },
    )
    if settings.ready_file is not None:
        try:
            write_ready_file(settings.ready_file, address)
        except OSError as exc:
            log.error("cannot write ready file %s: %s", settings.ready_file, exc)
            await running.close()
            return EXIT_CONFIG
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
            "blocks_claimed": service.blocks_claimed,
            "shutdown_s": round(time.monotonic() - started, 3),
        },
    )
    return 0
