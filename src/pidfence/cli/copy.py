"""``pidfence copy``: copy a topic exactly once, as one process (``--state``) or as a member of a
copier group (``--group``); the logic is in ``pidfence.producer.copier`` and ``copy_group``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pidfence.cli import producer_options
from pidfence.cli.exits import EXIT_USAGE, fail
from pidfence.cli.keys import ProducerPublicKeys


def register(app: typer.Typer) -> None:
    """Add ``copy`` to the ``pidfence`` app."""

    @app.command("copy")
    def copy(
        ctx: typer.Context,
        bootstrap: producer_options.Bootstrap,
        lease_server: producer_options.LeaseServers,
        from_topic: Annotated[str, typer.Option(help="Input topic")],
        to_topic: Annotated[str, typer.Option(help="Output topic (same partition count)")],
        state: Annotated[
            Path | None, typer.Option(help="One copier: its offsets + producer checkpoint file")
        ] = None,
        group: Annotated[
            str,
            typer.Option(
                help="A copier group: members share the partitions; the group's Kafka commits "
                "hold the checkpoints (no --state)"
            ),
        ] = "",
        group_key: Annotated[
            Path | None,
            typer.Option(help="Seal the group's committed checkpoints (64 hex digits, 0600)"),
        ] = None,
        session_timeout: Annotated[
            float,
            typer.Option(min=1, help="Seconds a silent group member keeps its partitions"),
        ] = 10.0,
        max_records: Annotated[
            int, typer.Option(min=0, help="Stop after N records this run (0: no limit)")
        ] = 0,
        idle_exit: Annotated[
            float,
            typer.Option(
                min=0,
                help="Stop after SECONDS without a record (0: never); a group member also waits "
                "until the group has committed every input partition to its end",
            ),
        ] = 10.0,
        checkpoint_every: Annotated[
            int,
            typer.Option(
                min=1, help="Flush and save --state (a group: commit a partition) every N records"
            ),
        ] = 200,
        ledger: producer_options.Ledger = None,
        lease_public_key: ProducerPublicKeys = None,
        message_timeout: producer_options.MessageTimeout = None,
        stop_after_commit: Annotated[
            int,
            typer.Option(
                min=0,
                help="Fault hook: SIGSTOP this group member after its N-th commit (0: never)",
            ),
        ] = 0,
        allow_data_loss: Annotated[
            bool,
            typer.Option(
                help="Continue after input records Kafka deleted before they were copied "
                "(retention overtook the copy); without it the copy refuses, exit 3",
            ),
        ] = False,
    ) -> None:
        """Copy FROM_TOPIC to TO_TOPIC; killed and restarted, the deduplicated output is exact."""
        from rich.progress import SpinnerColumn, TextColumn

        from pidfence.producer.copier import Copier, CopyResult, CopySpec

        _refuse_mistakes(ctx, from_topic, to_topic, group, state)
        spec = CopySpec(
            bootstrap=bootstrap,
            from_topic=from_topic,
            to_topic=to_topic,
            group=group,
            max_records=max_records,
            idle_exit_s=idle_exit,
            checkpoint_every=checkpoint_every,
            session_timeout_s=session_timeout,
            stop_after_commit=stop_after_commit,
            allow_data_loss=allow_data_loss,
        )
        who = f"{group}: " if group else ""
        columns = (
            SpinnerColumn(),
            TextColumn(f"{who}{from_topic} -> {to_topic}: {{task.completed}}"),
        )

        def copy_alone(open_producer: Any) -> CopyResult:
            copier = Copier(spec, open_producer, state or Path())
            return producer_options.with_progress(columns, None, copier.run)

        def copy_as_member(opened: tuple[Any, Any]) -> CopyResult:
            from pidfence.producer.copy_checkpoint import GroupKey, MetadataCodec
            from pidfence.producer.copy_group import CopyGroup

            open_task, ledger_writer = opened
            try:
                key = GroupKey.load(group_key) if group_key is not None else None
                codec = MetadataCodec(group, from_topic, to_topic, key)
                member = CopyGroup(spec, open_task, codec)
                return producer_options.with_progress(columns, None, member.run)
            finally:
                if ledger_writer is not None:
                    ledger_writer.close()

        result = producer_options.with_producer(
            bootstrap,
            lease_server,
            topic=to_topic,
            ledger=ledger,
            lease_public_key=lease_public_key,
            message_timeout=message_timeout,
            run=copy_as_member if group else copy_alone,
            opener=_group_opener if group else None,
        )
        if group:
            typer.echo(
                f"copied {result.copied} records in this run as a member of group {group} "
                f"(per partition {result.per_partition}); next offsets {result.offsets}"
            )
            return
        typer.echo(
            f"copied {result.copied} records in total; next offsets {result.offsets}; "
            f"resumed={result.resumed}"
        )


#: The options only a copier group reads (parameter -> flag); a single copier would ignore them.
GROUP_ONLY: dict[str, str] = {
    "group_key": "--group-key",
    "session_timeout": "--session-timeout",
    "stop_after_commit": "--stop-after-commit",
}


def _refuse_mistakes(
    ctx: typer.Context, from_topic: str, to_topic: str, group: str, state: Path | None
) -> None:
    """Exit 2 on a command line that would copy wrongly or ignore an option without a word."""
    if from_topic == to_topic:
        fail(
            "copy",
            f"--from-topic and --to-topic are both {from_topic!r}: the copy would read its own "
            "output back forever; give another --to-topic",
            EXIT_USAGE,
        )
    if not group and state is None:
        fail("copy", "give --state FILE (one copier) or --group NAME (a copier group)", EXIT_USAGE)
    if group and state is not None:
        if state.exists():
            fail(
                "copy",
                f"{state} holds a single copier's progress, which a group cannot continue (it "
                "would copy everything again): drop --group to go on with this copier, or drop "
                "--state to start the group on a new output topic",
                EXIT_USAGE,
            )
        # A group never writes the file: a later single copier would find none, copy it all again.
        fail(
            "copy",
            "--state and --group exclude each other: a group keeps its checkpoints in its Kafka "
            "commits and never writes --state; drop one of them",
            EXIT_USAGE,
        )
    if not group:
        given = []
        for name, flag in GROUP_ONLY.items():
            # By its source: a value equal to the default, given explicitly, is given too.
            source = ctx.get_parameter_source(name)
            if source is not None and source.name != "DEFAULT":
                given.append(flag)
        if given:
            fail(
                "copy",
                f"{', '.join(given)} only {'apply' if len(given) > 1 else 'applies'} to a copier "
                f"group: add --group NAME or drop {'them' if len(given) > 1 else 'it'}",
                EXIT_USAGE,
            )


def _group_opener(
    settings: Any, client: Any, ledger: Path | None = None, **_: Any
) -> tuple[Any, Any]:
    """The group's task opener and the one ledger writer its tasks share (or None)."""
    from pidfence.ledger import LedgerWriter
    from pidfence.producer.copy_task import task_opener

    writer = LedgerWriter(ledger) if ledger is not None else None
    return task_opener(settings, client, ledger=writer), writer
