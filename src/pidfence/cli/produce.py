"""``pidfence produce``: a resumable load generator (logic in ``pidfence.producer.loadgen``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli import producer_options
from pidfence.cli.keys import ProducerPublicKeys


def register(app: typer.Typer) -> None:
    """Add ``produce`` to the ``pidfence`` app."""

    @app.command("produce")
    def produce(
        bootstrap: producer_options.Bootstrap,
        lease_server: producer_options.LeaseServers,
        topic: Annotated[str, typer.Option(help="An existing topic")],
        count: Annotated[int, typer.Option(min=0, help="Records in total, across restarts")],
        value_size: Annotated[int, typer.Option(min=0, help="Bytes per value")] = 100,
        keys: Annotated[int, typer.Option(min=0, help="Distinct keys (0: unkeyed)")] = 1000,
        ledger: producer_options.Ledger = None,
        state: Annotated[
            Path | None, typer.Option(help="Checkpoint file: resume from it, keep it current")
        ] = None,
        rate: Annotated[float, typer.Option(min=0, help="Records per second (0: unlimited)")] = 0,
        resend_every: Annotated[
            int, typer.Option(min=0, help="Re-send the last acknowledged records every N records")
        ] = 0,
        lifetime_rollover: Annotated[
            float, typer.Option(help="Lease a new pid after this fraction of the lease lifetime")
        ] = 23 / 24,
        checkpoint_every: producer_options.CheckpointEvery = 500,
        name: Annotated[str, typer.Option(help="Producer name written into every value")] = "p",
        stop_after_checkpoint: Annotated[
            int,
            typer.Option(
                min=0,
                help="Fault hook: SIGSTOP this process right after its N-th state save (0: never)",
            ),
        ] = 0,
        lease_public_key: ProducerPublicKeys = None,
        librdkafka_idempotence: Annotated[
            bool,
            typer.Option(help="librdkafka's own idempotence (in-order on the wire per session)"),
        ] = True,
        message_timeout: producer_options.MessageTimeout = None,
    ) -> None:
        """Send COUNT deterministic records with pf headers; resumable after SIGKILL via --state."""
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

        from pidfence.producer.loadgen import LoadGenerator, LoadResult, LoadSpec
        from pidfence.producer.opening import OpenProducer

        spec = LoadSpec(
            name=name,
            topic=topic,
            count=count,
            value_size=value_size,
            keys=keys,
            rate=rate,
            resend_every=resend_every,
            checkpoint_every=checkpoint_every,
            stop_after_checkpoint=stop_after_checkpoint,
        )
        columns = (TextColumn(f"[bold]{name}[/] -> {topic}"), BarColumn(), MofNCompleteColumn())

        generators: list[LoadGenerator] = []

        def generate(open_producer: OpenProducer) -> LoadResult:
            generators.append(LoadGenerator(spec, open_producer, state))
            return producer_options.with_progress(columns, count, generators[0].run)

        result = producer_options.with_producer(
            bootstrap,
            lease_server,
            topic=topic,
            ledger=ledger,
            lease_public_key=lease_public_key,
            message_timeout=message_timeout,
            run=generate,
            # Without a state file a rerun sends everything again under a new pid: it continues
            # this run only while this run has handed Kafka nothing.
            resumable=lambda: state is not None or not any(g.produced for g in generators),
            enable_idempotence=librdkafka_idempotence,
            rollover_fraction=lifetime_rollover,
            resend_buffer=16 if resend_every else 0,
        )
        typer.echo(
            f"produced {result.next_i - result.first_i} records (i {result.first_i}.."
            f"{result.next_i - 1}) as pid {result.pid} generation {result.generation}; "
            f"resumed={result.resumed} resumed_from_expired={result.resumed_from_expired} "
            f"resent={result.resent} rollovers={result.rollovers}"
        )
