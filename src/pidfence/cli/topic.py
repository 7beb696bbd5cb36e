"""``pidfence topic create``: a Kafka topic for the producers and the sink (exit 3 when Kafka
cannot be reached or refuses; a topic that exists already is left as it is, exit 0).

A raw topic gets ``message.timestamp.type=LogAppendTime`` unless asked otherwise: the sink judges a
lease certificate's expiry at the record's timestamp, and only the broker's clock is one a writer
cannot back-date (docs/security.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from pidfence.cli.exits import EXIT_UNAVAILABLE, fail


class TimestampType(StrEnum):
    """A topic's ``message.timestamp.type``."""

    LOG_APPEND_TIME = "LogAppendTime"
    CREATE_TIME = "CreateTime"


def topic_config(timestamp_type: TimestampType) -> dict[str, str]:
    """The configs ``topic create`` gives a new topic (the demo's raw topics get the same by
    default: ``pidfence.demo.topic.RAW_TOPIC_CONFIG``)."""
    return {"message.timestamp.type": timestamp_type.value}


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
        timestamp_type: Annotated[
            TimestampType,
            typer.Option(
                help="message.timestamp.type: LogAppendTime (the broker stamps each record, as "
                "the sink wants for a raw topic it verifies certificates on) or CreateTime (the "
                "writer's timestamp, e.g. a copier's input topic)",
            ),
        ] = TimestampType.LOG_APPEND_TIME,
    ) -> None:
        """Create topic NAME and wait until every partition has a leader. A topic that exists
        already keeps its configs."""
        from confluent_kafka import KafkaError, KafkaException

        from pidfence.services import ServiceFailed, create_topic

        try:
            config = topic_config(timestamp_type)
            create_topic(bootstrap, name, partitions, replication, config, timeout=30)
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
        typer.echo(f"created topic {name} ({partitions} partitions, {timestamp_type.value})")
