"""``pidfence copy``: copy a topic exactly once (logic in ``pidfence.producer.copier``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli import producing
from pidfence.cli.keys import ProducerPublicKeys


def register(app: typer.Typer) -> None:
    """Add ``copy`` to the ``pidfence`` app."""

    @app.command("copy")
    def copy(
        bootstrap: producing.Bootstrap,
        lease_server: producing.LeaseServers,
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
        checkpoint_every: producing.CheckpointEvery = 200,
        ledger: producing.Ledger = None,
        lease_public_key: ProducerPublicKeys = None,
        message_timeout: producing.MessageTimeout = None,
    ) -> None:
        """Copy FROM_TOPIC to TO_TOPIC; killed and restarted, the deduplicated output is exact."""
        from rich.progress import SpinnerColumn, TextColumn

        from pidfence.producer.copier import Copier, CopyResult, CopySpec
        from pidfence.producer.loadgen import OpenProducer

        spec = CopySpec(
            bootstrap=bootstrap,
            from_topic=from_topic,
            to_topic=to_topic,
            group=group,
            max_records=max_records,
            idle_exit_s=idle_exit,
            checkpoint_every=checkpoint_every,
        )
        columns = (SpinnerColumn(), TextColumn(f"{from_topic} -> {to_topic}: {{task.completed}}"))

        def copy_all(open_producer: OpenProducer) -> CopyResult:
            return producing.with_progress(columns, None, Copier(spec, open_producer, state).run)

        result = producing.with_producer(
            bootstrap,
            lease_server,
            topic=to_topic,
            ledger=ledger,
            lease_public_key=lease_public_key,
            message_timeout=message_timeout,
            run=copy_all,
        )
        typer.echo(
            f"copied {result.copied} records in total; next offsets {result.offsets}; "
            f"resumed={result.resumed}"
        )
