"""``pidfence lease-server``: run a PID lease server (logic in ``pidfence.pid_allocator``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``"24h"``, ``"90s"``, ``"500ms"``, ``"15m"``, ``"2d"`` (or bare milliseconds) in ms."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", text)
    if match is None or int(match.group(1)) <= 0:
        raise typer.BadParameter(f"{text!r} is not a duration like 24h, 90s, 15m or 500ms")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` to a pair."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise typer.BadParameter(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return host, int(port)


def register(app: typer.Typer) -> None:
    """Add ``lease-server`` to the ``pidfence`` app."""

    @app.command("lease-server")
    def lease_server(
        zk: Annotated[str, typer.Option("--zk", help="ZooKeeper hosts, e.g. h1:2181,h2:2181/app")],
        listen: Annotated[str, typer.Option(help="HOST:PORT to listen on")] = "127.0.0.1:7070",
        block_size: Annotated[int, typer.Option(help="Pids per ZooKeeper claim")] = 100,
        lifetime: Annotated[str, typer.Option(help="Lease lifetime: 24h, 90s, ...")] = "24h",
        block_ttl: Annotated[
            str, typer.Option(help="Issue from a claimed block at most this long")
        ] = "10m",
        capacity: Annotated[int, typer.Option(help="Live leases held (lease ring)")] = 1_000_000,
        max_connections: Annotated[int, typer.Option(help="Open connections at most")] = 1024,
        idle_timeout: Annotated[str, typer.Option(help="Close connections idle this long")] = "5m",
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve Prometheus metrics on this port")
        ] = None,
        log_format: Annotated[str, typer.Option(help="json or text")] = "text",
        ready_file: Annotated[
            Path | None, typer.Option(help="Write HOST:PORT here once listening")
        ] = None,
    ) -> None:
        """Run a PID lease server until SIGTERM or SIGINT."""
        from pidfence.pid_allocator.cli_main import ServeOptions, serve_forever

        if log_format not in ("json", "text"):
            raise typer.BadParameter("--log-format must be json or text")
        host, port = parse_listen(listen)
        options = ServeOptions(
            zk_hosts=zk,
            host=host,
            port=port,
            block_size=block_size,
            lifetime_ms=parse_duration_ms(lifetime),
            block_ttl_ms=parse_duration_ms(block_ttl),
            capacity=capacity,
            max_connections=max_connections,
            idle_timeout_s=parse_duration_ms(idle_timeout) / 1000,
            metrics_port=metrics_port,
            log_format=log_format,
            ready_file=ready_file,
        )
        try:
            code = serve_forever(options)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        raise typer.Exit(code)
