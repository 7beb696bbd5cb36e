"""``pidfence topic create``: a Kafka topic for the producers and the sink (exit 3 when Kafka
cannot be reached or refuses; a topic that exists already is left as it is, exit 0)."""

from __future__ import annotations

from typing import Annotated

import typer

from pidfence.cli.exits import EXIT_UNAVAILABLE, fail


def register(app: typer.Typer) -> None:
    """Add ``topic create`` to the ``pidfence`` app."""
    group = typer.Typer(no_args_is_help=True, help="Create a Kafka topic.")
    app.add_typer(group, name="topic")

    @group.command("create")
    def create(
        name: Annotated[str, typer.Argument(help="The topic's name")],
        bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers")],
        partitions: Annotated[int, typer.Option(min=1, help="Partitions")] = 1,
        replication: Annotated[int, typer.Option(min=1, help="Replicas of each partition")] = 1,
    ) -> None:
        """Create topic NAME and wait until every partition has a leader."""
        from confluent_kafka import KafkaError, KafkaException

        from pidfence.services import ServiceFailed, create_topic

        try:
            create_topic(bootstrap, name, partitions, replication, timeout=30)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                typer.echo(f"topic {name} exists already")
                return
            fail("topic create", f"{bootstrap}: {exc}", EXIT_UNAVAILABLE)
        except TimeoutError:
            fail("topic create", f"{bootstrap}: Kafka did not answer within 30 s", EXIT_UNAVAILABLE)
        except ServiceFailed as exc:  # created, but its partitions got no leader in time
            fail("topic create", f"{bootstrap}: {exc}", EXIT_UNAVAILABLE)
        typer.echo(f"created topic {name} ({partitions} partitions)")
