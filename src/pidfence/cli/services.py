"""``pidfence services up|status|down``: local ZooKeeper and Kafka (in ``pidfence.services``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

RunDir = Annotated[
    Path | None,
    typer.Option(
        "--run-dir", help="State, data and logs (default: $PIDFENCE_RUN_DIR or .cache/services)"
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
    ) -> None:
        """Start the services, wait until they serve, and leave them running."""
        from pidfence.services import ServiceFailed, Services, ServicesError

        stack = Services(zookeeper=zookeeper, kafka=kafka, run_dir=run_dir)
        try:
            state = stack.up(timeout)
        except (ServicesError, ServiceFailed) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        typer.echo(f"zookeeper {state.zookeeper}")
        typer.echo(f"kafka     {state.kafka}")
        typer.echo(f"run dir   {state.run_dir} (stop with `pidfence services down`)")

    @group.command("status")
    def status(
        run_dir: RunDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    ) -> None:
        """Show the recorded services; exit 1 when none are recorded."""
        from rich.console import Console
        from rich.table import Table

        from pidfence.services import ServicesError
        from pidfence.services import status as read_status

        try:
            state = read_status(run_dir)
        except ServicesError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        if state is None:
            typer.echo("no services recorded (start them with `pidfence services up`)", err=True)
            raise typer.Exit(1)
        doc = state.status()
        if as_json:
            typer.echo(json.dumps(doc))
            return
        table = Table(title=f"pidfence services ({state.run_dir})")
        for column in ("node", "pid", "port", "alive", "log"):
            table.add_column(column)
        for node in state.nodes:
            alive = "yes" if doc["alive"][node.name] else "[red]no[/red]"
            table.add_row(node.name, str(node.pid), str(node.port), alive, node.log)
        console = Console()
        console.print(table)
        console.print(f"zookeeper {state.zookeeper}\nkafka     {state.kafka}")

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
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        typer.echo(f"stopped {', '.join(stopped) if stopped else 'nothing (none running)'}")
