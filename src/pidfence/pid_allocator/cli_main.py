"""The process behind ``pidfence lease-server``: logs, metrics endpoint, signals, shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pidfence.pid_allocator.errors import LeaseServiceUnavailable
from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.pid_allocator.runtime import start_server
from pidfence.pid_allocator.server import ServerLimits
from pidfence.pid_allocator.service import ServiceConfig

log = logging.getLogger("pidfence.lease_server")


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``pidfence lease-server`` was given."""

    zk_hosts: str
    host: str = "127.0.0.1"
    port: int = 7070
    block_size: int = 100
    lifetime_ms: int = 24 * 3_600_000
    block_ttl_ms: int = 600_000
    capacity: int = 1_000_000
    max_connections: int = 1024
    idle_timeout_s: float = 300.0
    metrics_port: int | None = None
    log_format: str = "text"
    ready_file: Path | None = None


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


def serve_forever(options: ServeOptions) -> int:
    """Run until SIGTERM/SIGINT; return the exit code (0 clean, 3 ZooKeeper unreachable)."""
    configure_logging(options.log_format)
    config = ServiceConfig(
        block_size=options.block_size,
        lifetime_ms=options.lifetime_ms,
        capacity=options.capacity,
        block_ttl_ms=options.block_ttl_ms,
    )
    limits = ServerLimits(
        max_connections=options.max_connections, idle_timeout_s=options.idle_timeout_s
    )
    try:
        return asyncio.run(_serve(options, config, limits))
    except LeaseServiceUnavailable as exc:
        log.error("startup failed: %s", exc)
        return 3


async def _serve(options: ServeOptions, config: ServiceConfig, limits: ServerLimits) -> int:
    metrics = ServerMetrics()
    if options.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port, addr=options.host, registry=metrics.registry)
    running = await start_server(
        options.zk_hosts,
        host=options.host,
        port=options.port,
        config=config,
        limits=limits,
        metrics=metrics,
    )
    address = f"{running.host}:{running.port}"
    log.info(
        "listening on %s",
        address,
        extra={"address": address, "server_id": running.server.service.server_id},
    )
    if options.ready_file is not None:
        tmp = options.ready_file.with_suffix(".tmp")
        tmp.write_text(address)
        os.replace(tmp, options.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    started = time.monotonic()
    await running.close()
    service = running.server.service
    log.info(
        "stopped",
        extra={
            "leases": service.leases,
            "bumps": service.bumps,
            "blocks_claimed": service.blocks_claimed,
            "shutdown_s": round(time.monotonic() - started, 3),
        },
    )
    return 0
