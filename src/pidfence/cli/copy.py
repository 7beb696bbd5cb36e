"""``pidfence copy``: copy a topic exactly once (logic in ``pidfence.producer.copier``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli.keys import ProducerPublicKeys, producer_public_keys


def register(app: typer.Typer) -> None:
    """Add ``copy`` to the ``pidfence`` app."""

    @app.command("copy")
    def copy(
        bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers HOST:PORT[,...]")],
        lease_server: Annotated[
            str, typer.Option("--lease-server", help="Lease servers HOST:PORT[,HOST:PORT]")
        ],
        from_topic: Annotated[str, typer.Option(help="Input topic")],
        to_topic: Annotated[str, typer.Option(help="Output topic (same partition count)")],
        state: Annotated[Path, typer.Option(help="Offsets + producer checkpoint file")],
        group: Annotated[str, typer.Option(help="Consumer group.id (identity only)")] = "",
        max_records: Annotated[
            int, typer.Option(min=0, help="Stop after N records this run (0: no limit)")
        ] = 0,
        idle_exit: Annotated[
            float, typer.Option(min=0, help="Stop after SECONDS without a record (0: never)")
        ] = 10.0,
        checkpoint_every: Annotated[
            int, typer.Option(min=1, help="Flush and save --state every N records")
        ] = 200,
        ledger: Annotated[
            Path | None, typer.Option(help="Send ledger (JSON lines) of acknowledged records")
        ] = None,
        lease_public_key: ProducerPublicKeys = None,
    ) -> None:
        """Copy FROM_TOPIC to TO_TOPIC; killed and restarted, the deduplicated output is exact."""
        from rich.progress import Progress, SpinnerColumn, TextColumn

        from pidfence.pid_allocator import LeaseClient, lease_client_options
        from pidfence.producer import ProducerConfig
        from pidfence.producer.cliutil import fail_cleanly
        from pidfence.producer.copier import Copier, CopySpec
        from pidfence.producer.loadgen import open_producer_factory

        with fail_cleanly():
            spec = CopySpec(
                bootstrap=bootstrap,
                from_topic=from_topic,
                to_topic=to_topic,
                group=group,
                max_records=max_records,
                idle_exit_s=idle_exit,
                checkpoint_every=checkpoint_every,
            )
            public_keys = producer_public_keys(lease_public_key)
            config = ProducerConfig(bootstrap, lease_public_keys=public_keys)
            # Token and TLS from $PIDFENCE_LEASE_TOKEN_FILE / _TOKEN / _TLS_CA (never argv).
            with LeaseClient(lease_server, **lease_client_options()) as client:
                copier = Copier(
                    spec,
                    open_producer_factory(config, client, ledger=ledger, topics=[to_topic]),
                    state,
                )
                with Progress(
                    SpinnerColumn(), TextColumn(f"{from_topic} -> {to_topic}: {{task.completed}}")
                ) as progress:
                    task = progress.add_task("copy", total=None)
                    result = copier.run(lambda done: progress.update(task, completed=done))
            typer.echo(
                f"copied {result.copied} records in total; next offsets {result.offsets}; "
                f"resumed={result.resumed}"
            )
