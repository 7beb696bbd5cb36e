"""``pidfence lease-server``: run a PID lease server (logic in ``pidfence.pid_allocator``).

The options are made from the settings' declarations (``pidfence.pid_allocator.settings``);
this module only collects what the user gave and hands it to ``load_settings`` (flags, then
``PIDFENCE_LEASE_SERVER_*``, then ``--config FILE``).

``pidfence lease-server --health HOST:PORT`` pings a running server instead (exit 0 only on a
real ping reply), for compose healthchecks and supervisors.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from pidfence import durations
from pidfence.cli.exits import EXIT_UNAVAILABLE, EXIT_USAGE, code_of, fail
from pidfence.pid_allocator.declaration import Setting
from pidfence.pid_allocator.settings import declared
from pidfence.pid_allocator.settings_sources import (
    default_text,
    env_name,
    flag,
    load_settings,
    parse_listen,
)
from pidfence.wire import PidfenceError

_COMMAND = "lease-server"


def parse_duration_ms(text: str) -> int:
    """A duration option of any command (``24h``, ``90s``, ``500ms``) in ms.

    Raises:
        typer.BadParameter: not a positive whole duration (typer's usage error, exit 2).
    """
    try:
        return durations.parse_duration_ms(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def health(address: str, tls_ca: Path | None, timeout_s: float, command: str = _COMMAND) -> int:
    """Ping ``address`` once; 0 on a ping reply, 1 otherwise (the reason on stderr).

    ``command`` names the command in a usage error's line (``lease-ping`` or ``lease-server``).
    """
    from pidfence.pid_allocator import LeaseClient, LeaseError, SecretFileError, client_tls_context

    if not (math.isfinite(timeout_s) and timeout_s > 0):
        fail(command, f"--timeout must be a number of seconds > 0, got {timeout_s:g}", EXIT_USAGE)
    try:
        parse_listen(address)
        tls = None if tls_ca is None else client_tls_context(tls_ca)
    except (ValueError, SecretFileError) as exc:
        fail(command, str(exc), EXIT_USAGE)
    try:
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


def _parameter(item: Setting) -> inspect.Parameter:
    # Escaped: rich would read ``pidfence[fast]`` as markup and print ``pidfence``.
    help_text = escape(f"{item.help} (default {default_text(item)}; env {env_name(item)})")
    kind: Any = bool | None if item.kind == "flag" else str | None
    annotation = Annotated[kind, typer.Option(flag(item), help=help_text, show_default=False)]
    return inspect.Parameter(
        item.option.replace("-", "_"),
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=annotation,
    )


def _run(flags: dict[str, Any], config: Path | None) -> None:
    from pidfence.pid_allocator.daemon import serve_forever
    from pidfence.pid_allocator.declaration import SettingsError
    from pidfence.pid_allocator.errors import LeaseServiceUnavailable

    try:
        settings = load_settings(flags, os.environ, config)
        if settings.zk_hosts is None:
            raise SettingsError("--zk is required to run a server (or PIDFENCE_LEASE_SERVER_ZK)")
        serve_forever(settings)
    except LeaseServiceUnavailable as exc:
        fail(_COMMAND, str(exc), EXIT_UNAVAILABLE)  # ZooKeeper unreachable at start
    except PidfenceError as exc:
        # A bad setting or a bad file named by one (token file readable by others, key not
        # Ed25519, ready file not writable): the command line needs fixing.
        fail(_COMMAND, str(exc), EXIT_USAGE if not exc.retriable else code_of(exc))


def _command() -> Callable[..., None]:
    """The ``lease-server`` command function, its options built from the declarations."""

    def lease_server(**given: Any) -> None:
        """Run a PID lease server until SIGTERM or SIGINT (or, with --health, ping one)."""
        config = given.pop("config")
        health_address = given.pop("health")
        tls_ca = given.pop("tls_ca")
        timeout = given.pop("timeout")
        if health_address is not None:
            raise typer.Exit(health(health_address, tls_ca, timeout))
        _run({name.replace("_", "-"): value for name, value in given.items()}, config)
        raise typer.Exit(0)

    def keyword(name: str, default: Any, kind: Any, flag: str, help_text: str) -> inspect.Parameter:
        option = typer.Option(flag, help=help_text)
        return inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[kind, option],
        )

    extra = [
        keyword("config", None, Path | None, "--config", "TOML file of settings (option names)"),
        keyword("health", None, str | None, "--health", "Ping HOST:PORT; exit 0 only on a reply"),
        keyword("tls_ca", None, Path | None, "--tls-ca", "With --health: CA of the server's TLS"),
        keyword("timeout", 3.0, float, "--timeout", "With --health: seconds to wait"),
    ]
    parameters = [_parameter(item) for item in declared()] + extra
    lease_server.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    lease_server.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return lease_server


def register(app: typer.Typer) -> None:
    """Add ``lease-server`` and ``lease-ping`` to the ``pidfence`` app."""
    app.command("lease-server")(_command())

    @app.command("lease-ping")
    def lease_ping(
        address: Annotated[str, typer.Argument(help="HOST:PORT of a lease server")],
        tls_ca: Annotated[
            Path | None,
            typer.Option(help="CA certificate (PEM) to verify a server that serves TLS"),
        ] = None,
        timeout: Annotated[float, typer.Option(help="Seconds to wait")] = 3.0,
    ) -> None:
        """Ping a lease server; exit 0 only on a real ping reply."""
        raise typer.Exit(health(address, tls_ca, timeout, "lease-ping"))
