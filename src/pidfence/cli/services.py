"""``pidfence services up|status|down``: local ZooKeeper and Kafka (in ``pidfence.services``)."""

from __future__ import annotations

import json
import signal
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from pidfence.cli.exits import EXIT_UNAVAILABLE, fail, first_line
from pidfence.cli.extras import require
from pidfence.lifecycle import signals_raise

if TYPE_CHECKING:
    from pidfence.services import ServicesState

RunDir = Annotated[
    Path | None,
    typer.Option(
        "--run-dir",
        help="State, data and logs (default: $PIDFENCE_RUN_DIR or ~/.cache/pidfence/services)",
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``services`` and its subcommands to the ``pidfence`` app."""
    group = typer.Typer(
        no_args_is_help=True,
        help="Start, inspect and stop a local ZooKeeper ensemble and Kafka (KRaft) cluster.",
    )
    app.add_typer(group, name="services")

    @group.command("up")
    def up(
        zookeeper: Annotated[int, typer.Option(min=1, max=3, help="ZooKeeper nodes")] = 1,
        kafka: Annotated[int, typer.Option(min=1, max=3, help="Kafka nodes")] = 1,
        run_dir: RunDir = None,
        timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness")] = 180.0,
        s3: Annotated[
            bool,
            typer.Option(
                "--s3",
                help="Also start an S3 object store (SeaweedFS) on loopback and print the "
                "AWS environment to export for it (needs the `demo` extra)",
            ),
        ] = False,
    ) -> None:
        """Start the services, wait until they serve, and leave them running.

        Already up: says so, prints the status and exits 0. Exit 3 when some recorded node has
        died, a server does not become ready, or Java or the servers' jars (fetched from Maven
        Central on first use) cannot be had; 130 on Ctrl-C, 143 on SIGTERM (129 on SIGHUP),
        after stopping every server it started.
        """
        from pidfence.jars import JarsError
        from pidfence.services import (
            ServiceFailed,
            Services,
            ServicesAlreadyUp,
            ServicesError,
        )

        if s3:
            require("demo", "services up --s3")
        stack = Services(zookeeper=zookeeper, kafka=kafka, run_dir=run_dir, s3=s3)
        try:
            with stopped_by_signals():
                state = stack.up(timeout)
        except KeyboardInterrupt:
            _stopped("interrupted (SIGINT)", 130)
        except UpStopped as exc:
            _stopped(f"stopped by {exc}", exc.exit_code)
        except ServicesAlreadyUp as exc:
            typer.echo(f"already up in {exc.state.run_dir}")
            _print_status(exc.state)
            shape = _shape(exc.state)
            if shape != (zookeeper, kafka) or bool(exc.state.s3) != s3:
                store = " and an S3 store" if exc.state.s3 else ", no S3 store"
                fail(
                    "services up",
                    f"the running services have {shape[0]} ZooKeeper and {shape[1]} Kafka "
                    f"node(s){store}, not what was asked: run `pidfence services down` first",
                    EXIT_UNAVAILABLE,
                )
            if exc.state.s3:
                _print_s3(exc.state)
            return
        except (ServicesError, ServiceFailed, JarsError) as exc:
            fail("services up", first_line(exc), EXIT_UNAVAILABLE)
        typer.echo(f"zookeeper {state.zookeeper}")
        typer.echo(f"kafka     {state.kafka}")
        typer.echo(f"run dir   {state.run_dir} (stop with `pidfence services down`)")
        if state.s3:
            _print_s3(state)

    @group.command("status")
    def status(
        run_dir: RunDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    ) -> None:
        """Show the recorded services. Exit 0 when all run, 3 when one is dead or none is
        recorded."""
        from pidfence.services import ServicesError
        from pidfence.services import status as read_status

        try:
            state = read_status(run_dir)
        except ServicesError as exc:
            fail("services status", first_line(exc), EXIT_UNAVAILABLE)
        if state is None:
            if as_json:
                typer.echo(json.dumps({"zookeeper": None, "kafka": None, "alive": {}}))
            fail("services status", _NONE_RECORDED, EXIT_UNAVAILABLE)
        if as_json:
            typer.echo(json.dumps(state.status()))
        else:
            _print_status(state)
        dead = state.dead()
        if dead:
            names = ", ".join(f"{n.name} (pid {n.pid}, log {n.log})" for n in dead)
            fail("services status", f"not running: {names}", EXIT_UNAVAILABLE)

    @group.command("env")
    def env(run_dir: RunDir = None) -> None:
        """Print shell `export` lines for `eval "$(pidfence services env)"`: PIDFENCE_BOOTSTRAP
        (Kafka), PIDFENCE_ZK (ZooKeeper) and PIDFENCE_LEASE (a loopback address `services up`
        kept free for a lease server you start: the same in every shell). Exit 3 when none is
        recorded or one is dead."""
        from pidfence.services import ServicesError, free_port
        from pidfence.services import status as read_status

        try:
            state = read_status(run_dir)
        except ServicesError as exc:
            fail("services env", first_line(exc), EXIT_UNAVAILABLE)
        if state is None:
            fail("services env", _NONE_RECORDED, EXIT_UNAVAILABLE)
        if state.dead():
            fail("services env", "a service is not running: see `pidfence services status`")
        typer.echo(f"export PIDFENCE_BOOTSTRAP={state.kafka}")
        typer.echo(f"export PIDFENCE_ZK={state.zookeeper}")
        # A state written before the address was kept has none: any free port, as then.
        typer.echo(f"export PIDFENCE_LEASE={state.lease or f'127.0.0.1:{free_port()}'}")

    @group.command("down")
    def down(
        run_dir: RunDir = None,
        timeout: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL")] = 20.0,
    ) -> None:
        """Stop the recorded services by pid (SIGTERM, then SIGKILL) and remove the run state."""
        from pidfence.services import ServicesError
        from pidfence.services import down as stop_services

        try:
            stopped = stop_services(run_dir, timeout)
        except ServicesError as exc:
            fail("services down", first_line(exc), EXIT_UNAVAILABLE)
        typer.echo(f"stopped {', '.join(stopped) if stopped else 'nothing (none running)'}")


_NONE_RECORDED = "no services recorded (start them with `pidfence services up`)"

#: The signals that stop ``services up`` the way Ctrl-C does (the terminal closed: SIGHUP).
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class UpStopped(BaseException):
    """SIGTERM (or SIGHUP) stopped ``services up``; it unwinds like Ctrl-C, so the servers it
    started are stopped (they run in sessions of their own: the signal reached none of them).

    A BaseException, like :class:`KeyboardInterrupt`, so no ``except Exception`` swallows it;
    ``exit_code`` is 128 + the signal's number (143 for SIGTERM).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def stopped_by_signals() -> AbstractContextManager[None]:
    """Within: the first of :data:`STOPPING_SIGNALS` raises :class:`UpStopped` (later ones are
    ignored while it unwinds); the previous handlers come back after
    (:func:`~pidfence.lifecycle.signals_raise`)."""
    return signals_raise(STOPPING_SIGNALS, UpStopped)


def _stopped(how: str, code: int) -> NoReturn:
    """One stderr line for an ``up`` a signal stopped, then 128 + the signal."""
    sys.stderr.write(f"pidfence services up: {how}: every server it started was stopped\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def _shape(state: ServicesState) -> tuple[int, int]:
    names = [n.name for n in state.nodes]
    return (
        sum(n.startswith("zookeeper-") for n in names),
        sum(n.startswith("kafka-") for n in names),
    )


def _print_status(state: ServicesState) -> None:
    from rich.console import Console
    from rich.table import Table

    doc = state.status()
    table = Table(title=f"pidfence services ({state.run_dir})")
    for column in ("node", "pid", "port", "alive"):
        table.add_column(column)
    table.add_column("log", overflow="fold")
    for node in state.nodes:
        alive = "yes" if doc["alive"][node.name] else "[red]DEAD[/red]"
        table.add_row(node.name, str(node.pid), str(node.port), alive, node.log)
    console = Console(soft_wrap=True)
    console.print(table)
    console.print(f"zookeeper {state.zookeeper}\nkafka     {state.kafka}")
    if state.s3:
        console.print(f"s3        {state.s3['AWS_ENDPOINT_URL']}")


def _print_s3(state: ServicesState) -> None:
    """The S3 store's environment, as ``export`` lines."""
    typer.echo("# the S3 store: export this environment for pidfence, boto3, delta-rs")
    typer.echo("\n".join(f"export {k}={v}" for k, v in state.s3.items()))
