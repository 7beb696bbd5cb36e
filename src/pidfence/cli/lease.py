"""``pidfence lease-server``: run a PID lease server (logic in ``pidfence.pid_allocator``).

``pidfence lease-server --health HOST:PORT`` pings a running server instead (exit 0 only on a
real ping reply), for compose healthchecks and supervisors.
"""

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


def health(address: str, tls_ca: Path | None, timeout_s: float) -> int:
    """Ping ``address`` once; 0 on a ping reply, 1 otherwise (the reason on stderr)."""
    from pidfence.pid_allocator import LeaseClient, LeaseError, client_tls_context

    parse_listen(address)
    try:
        tls = None if tls_ca is None else client_tls_context(tls_ca)
        with LeaseClient(
            address, connect_timeout_s=timeout_s, request_timeout_s=timeout_s, retries=0, tls=tls
        ) as client:
            reply = client.ping()
    except LeaseError as exc:
        typer.echo(f"unhealthy: {address}: {exc}", err=True)
        return 1
    if not isinstance(reply.get("now_ms"), int):
        typer.echo(f"unhealthy: {address} answered without now_ms", err=True)
        return 1
    typer.echo(f"ok {address} now_ms={reply['now_ms']}")
    return 0


_PathOpt = Annotated[Path | None, typer.Option()]


def register(app: typer.Typer) -> None:
    """Add ``lease-server`` to the ``pidfence`` app."""

    @app.command("lease-server")
    def lease_server(
        zk: Annotated[
            str | None, typer.Option("--zk", help="ZooKeeper hosts, e.g. h1:2181,h2:2181/app")
        ] = None,
        listen: Annotated[str, typer.Option(help="HOST:PORT to listen on")] = "127.0.0.1:7070",
        block_size: Annotated[
            int, typer.Option(help="Pids per ZooKeeper claim, at least (busy servers take more)")
        ] = 100,
        max_claim_blocks: Annotated[
            int,
            typer.Option(
                min=1, max=1024, help="Most blocks one claim takes when the server is busy"
            ),
        ] = 16,
        lifetime: Annotated[str, typer.Option(help="Lease lifetime: 24h, 90s, ...")] = "24h",
        block_ttl: Annotated[
            str, typer.Option(help="Issue from a claimed block at most this long")
        ] = "10m",
        retention: Annotated[
            str | None,
            typer.Option(help="Keep retired/expired pids known this long (default: lifetime)"),
        ] = None,
        capacity: Annotated[int, typer.Option(help="Live leases held (lease ring)")] = 1_000_000,
        client_share: Annotated[
            float, typer.Option(help="Fraction of the ring one client may hold")
        ] = 0.25,
        max_connections: Annotated[int, typer.Option(help="Open connections at most")] = 1024,
        max_connections_per_address: Annotated[
            int, typer.Option(help="Open connections from one address at most")
        ] = 64,
        idle_timeout: Annotated[str, typer.Option(help="Close connections idle this long")] = "5m",
        zk_queue: Annotated[
            int, typer.Option(help="ZooKeeper jobs queued at most (more: RATE_LIMITED)")
        ] = 256,
        auth_tokens: Annotated[
            Path | None, typer.Option(help="File of 'NAME TOKEN' lines; clients must hello")
        ] = None,
        tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate: serve TLS")] = None,
        tls_key: Annotated[Path | None, typer.Option(help="PEM key of --tls-cert")] = None,
        tls_client_ca: Annotated[
            Path | None, typer.Option(help="PEM CA: require client certificates (mutual TLS)")
        ] = None,
        zk_auth_file: Annotated[
            Path | None, typer.Option(help="USER:PASSWORD: ZooKeeper digest auth and ACLs")
        ] = None,
        signing_key: Annotated[
            Path | None, typer.Option(help="Ed25519 PEM key: sign every lease (cert)")
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve Prometheus metrics on this port")
        ] = None,
        log_format: Annotated[str, typer.Option(help="json or text")] = "text",
        event_loop: Annotated[
            str,
            typer.Option(
                "--loop", help="Event loop: auto (uvloop when installed), asyncio or uvloop"
            ),
        ] = "auto",
        ready_file: Annotated[
            Path | None, typer.Option(help="Write HOST:PORT here once listening")
        ] = None,
        health_address: Annotated[
            str | None,
            typer.Option("--health", help="Ping the server at HOST:PORT; exit 0 only on a reply"),
        ] = None,
        tls_ca: Annotated[
            Path | None, typer.Option(help="With --health: CA to verify the server's TLS")
        ] = None,
        timeout: Annotated[float, typer.Option(help="With --health: seconds to wait")] = 3.0,
    ) -> None:
        """Run a PID lease server until SIGTERM or SIGINT (or, with --health, ping one)."""
        if health_address is not None:
            raise typer.Exit(health(health_address, tls_ca, timeout))
        if zk is None:
            raise typer.BadParameter("--zk is required to run a server", param_hint="--zk")
        from pidfence.pid_allocator.cli_main import serve_forever
        from pidfence.pid_allocator.settings import LeaseServerSettings

        if log_format not in ("json", "text"):
            raise typer.BadParameter("--log-format must be json or text")
        host, port = parse_listen(listen)
        try:
            settings = LeaseServerSettings(
                host=host,
                port=port,
                block_size=block_size,
                max_claim_blocks=max_claim_blocks,
                lifetime_ms=parse_duration_ms(lifetime),
                block_ttl_ms=parse_duration_ms(block_ttl),
                retention_ms=None if retention is None else parse_duration_ms(retention),
                capacity=capacity,
                client_share=client_share,
                max_connections=max_connections,
                max_connections_per_address=max_connections_per_address,
                idle_timeout_s=parse_duration_ms(idle_timeout) / 1000,
                zk_queue=zk_queue,
                auth_tokens_file=auth_tokens,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_client_ca=tls_client_ca,
                zk_auth_file=zk_auth_file,
                signing_key=signing_key,
                metrics_port=metrics_port,
                log_format=log_format,
                ready_file=ready_file,
                event_loop=event_loop,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        raise typer.Exit(serve_forever(zk, settings))

    @app.command("lease-ping")
    def lease_ping(
        address: Annotated[str, typer.Argument(help="HOST:PORT of a lease server")],
        tls_ca: _PathOpt = None,
        timeout: Annotated[float, typer.Option(help="Seconds to wait")] = 3.0,
    ) -> None:
        """Ping a lease server; exit 0 only on a real ping reply."""
        raise typer.Exit(health(address, tls_ca, timeout))
