"""``pidfence sink``: a Kafka raw topic through the broker rules into the output log.

Before a JVM starts, it checks that Kafka answers (:mod:`pidfence.cli.preflight`) and what the
sink requires of its output and checkpoint (:mod:`pidfence.spark_sink.preflight`); Spark's and the
JVM's output go to a log file under the checkpoint (``--verbose`` shows them instead). Errors
exit by the one table in :mod:`pidfence.cli.exits`. The sink logic is in
:mod:`pidfence.spark_sink`.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import traceback
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from pidfence.cli.exits import (
    EXIT_RETRIABLE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    code_of,
    exit_cleanly,
    fail,
    first_line,
)
from pidfence.cli.extras import require
from pidfence.cli.keys import key_paths
from pidfence.cli.sink_care import register_care
from pidfence.cli.spark_master import SparkMaster
from pidfence.cli.storage import StorageOption, apply_storage_options


class StartingOffsets(StrEnum):
    """Where a new checkpoint starts reading the topic."""

    earliest = "earliest"
    latest = "latest"


def spark_log_path(checkpoint: str) -> Path:
    """Where the JVM's output goes: ``CHECKPOINT/logs/spark-TIME.log`` for a local checkpoint,
    else ``./pidfence-sink-logs/spark-TIME.log``."""
    name = f"spark-{time.strftime('%Y%m%d-%H%M%S')}.log"
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return Path("pidfence-sink-logs") / name
    return Path(checkpoint.removeprefix("file://")) / "logs" / name


_OPTION_HELP = (
    "Any other sink option of docs/sink.md's table as NAME=VALUE, repeatable "
    "(e.g. --option claimLapse=2m --option timestampSkew=2h)"
)
#: Sink options this command sets itself: from --output, --checkpoint and --starting-offsets,
#: and the claim's epoch.
_SET_BY_COMMAND = ("startingOffsets", "epoch")


def named_options(values: list[str] | None, given: dict[str, str]) -> dict[str, str]:
    """The sink options of ``--option NAME=VALUE`` (names as docs/sink.md spells them, any
    case), checked against the options the sink has and those ``given`` by their own flags.

    Raises:
        SinkOptionError: not NAME=VALUE, an unknown name, one this command sets itself, or one
            given twice.
    """
    from dataclasses import fields

    from pidfence.spark_sink import SinkOptions
    from pidfence.spark_sink.errors import SinkOptionError

    known = {
        f.metadata["name"].lower(): f.metadata["name"]
        for f in fields(SinkOptions)
        if f.metadata and f.metadata["name"] not in _SET_BY_COMMAND
    }
    named: dict[str, str] = {}
    for item in values or ():
        raw, sep, value = item.partition("=")
        name = known.get(raw.strip().lower())
        if not sep or name is None:
            raise SinkOptionError(
                f"--option {item!r}: give NAME=VALUE with NAME one of {', '.join(known.values())}"
            )
        if name in given or name in named:
            raise SinkOptionError(
                f"--option {item!r}: {name} is given twice (here, or by its own flag)"
            )
        named[name] = value.strip()
    return named


def register(app: typer.Typer) -> None:
    """Add ``sink`` (run the sink; ``sink compact``/``vacuum``: Delta table care)."""
    group = typer.Typer(
        name="sink",
        invoke_without_command=True,
        add_completion=False,
        help="Run the deduplicating sink (no subcommand), or take care of its Delta tables.",
    )
    app.add_typer(group)
    register_care(group)

    @group.callback()
    def sink(
        ctx: typer.Context,
        bootstrap: Annotated[
            str | None, typer.Option(help="Kafka bootstrap servers HOST:PORT[,...] (required)")
        ] = None,
        topic: Annotated[
            str | None, typer.Option(help="The raw topic to read (or TOPIC,TOPIC...) (required)")
        ] = None,
        output: Annotated[
            str | None,
            typer.Option(help="Output log path (local, or s3://BUCKET/PATH) (required)"),
        ] = None,
        checkpoint: Annotated[
            str | None, typer.Option(help="Spark checkpoint location (required)")
        ] = None,
        master: SparkMaster = "local[*]",
        available_now: Annotated[
            bool, typer.Option("--available-now", help="Process what is in the topic, then exit")
        ] = False,
        trigger: Annotated[
            float | None,
            typer.Option(
                min=0.0,
                help="Micro-batch interval in SECONDS (default: back to back); not with "
                "--available-now",
            ),
        ] = None,
        starting_offsets: Annotated[
            StartingOffsets, typer.Option(help="Where a new checkpoint starts")
        ] = StartingOffsets.earliest,
        tasks: Annotated[
            int | None,
            typer.Option(
                min=0,
                help="Spark tasks per batch, the topic's partitions coalesced into them, each "
                "partition whole in one (default: the cores Spark has; 0: one per partition)",
            ),
        ] = None,
        lifetime: Annotated[
            str | None, typer.Option(help="Producer entry lifetime: ms, or 90s, 15m, 24h, 7d")
        ] = None,
        capacity: Annotated[
            int | None, typer.Option(min=1, help="Most live producers per partition")
        ] = None,
        reorder_window: Annotated[
            int | None, typer.Option(min=0, help="How far ahead of highwater+1 a record may wait")
        ] = None,
        lease_public_key: Annotated[
            list[str] | None,
            typer.Option(
                "--lease-public-key",
                help="PEM public key(s) of the lease servers (FILE[,FILE], repeatable): records "
                "must carry a valid lease certificate, else FORGED",
            ),
        ] = None,
        record_mac_secret: Annotated[
            str | None,
            typer.Option(
                "--record-mac-secret",
                help="The lease servers' --record-mac-secret FILE: every idempotent record must "
                "carry a valid per-record MAC (pfm header), else FORGED (reason mac)",
            ),
        ] = None,
        allow_data_loss: Annotated[
            bool,
            typer.Option(
                "--allow-data-loss",
                help="Continue past Kafka offsets deleted before the sink read them (retention "
                "while it was stopped): the gap is reported and the producers met after it are "
                "adopted. Default: exit 3 naming the lost offsets",
            ),
        ] = False,
        lease_server: Annotated[
            str | None,
            typer.Option(
                "--lease-server",
                help="Lease servers HOST:PORT[,...]: where the sink could not see producers "
                "start (a trimmed head, --starting-offsets latest, --allow-data-loss) it adopts "
                "only those they vouch for (token and TLS from $PIDFENCE_LEASE_TOKEN_FILE / "
                "_TOKEN / _TLS_CA, as for producers). Without: such records are UNKNOWN_PID",
            ),
        ] = None,
        resolve_gaps: Annotated[
            bool,
            typer.Option(
                "--resolve-gaps/--no-resolve-gaps",
                help="When a producer's reorder window overflows, report the missing seqs as a "
                "gap and continue after them (default); --no-resolve-gaps keeps the proposal's "
                "strict rule: every later record is OUT_OF_ORDER until the generation moves",
            ),
        ] = True,
        metrics_port: Annotated[
            int | None,
            typer.Option(
                min=0,
                max=65535,
                help="Serve Prometheus metrics (/metrics) on this PORT from the driver",
            ),
        ] = None,
        metrics_host: Annotated[
            str,
            typer.Option(help="Address of the metrics endpoint: loopback unless told otherwise"),
        ] = "127.0.0.1",
        verbose: Annotated[
            bool, typer.Option("--verbose", help="Show Spark's and the JVM's log on the console")
        ] = False,
        option: Annotated[
            list[str] | None, typer.Option("--option", metavar="NAME=VALUE", help=_OPTION_HELP)
        ] = None,
        storage_option: StorageOption = None,
        jars: Annotated[
            Path | None,
            typer.Option(
                envvar="PIDFENCE_JARS",
                help="A folder holding Spark's Kafka connector and its dependencies, for a "
                "machine without network (default: fetched from Maven Central into the cache "
                "on first use)",
            ),
        ] = None,
    ) -> None:
        """Deduplicate TOPIC into the exactly-once output log at OUTPUT (and its rejects log).

        Exit 0 when done (or stopped by SIGINT/SIGTERM after a batch), 2 for a bad option,
        3 when Kafka cannot be reached, the topic does not exist, a path is not usable (another
        writer's Delta table), Spark did not start (the line shows why), or the query stopped on
        something a rerun meets again (its columns removed, a RESTORE to before its last batch,
        the table gone: the line names the commit and the fix; Kafka deleted records the sink had
        not read, see --allow-data-loss), 75 when running it again continues: the query failed on
        something that passes, a Kafka partition had no leader, the output's store failed, or
        Spark's cluster manager did not answer. Other writers appending to, compacting,
        vacuuming or deleting from its Delta tables never stop it.
        """
        require("sink", "sink")
        if ctx.invoked_subcommand is not None:
            return
        if bootstrap is None or topic is None or output is None or checkpoint is None:
            given = {
                "bootstrap": bootstrap,
                "topic": topic,
                "output": output,
                "checkpoint": checkpoint,
            }
            missing = ", ".join(f"--{name}" for name, value in given.items() if value is None)
            fail("sink", f"missing option {missing} (see pidfence sink --help)", EXIT_USAGE)
        if available_now and trigger is not None:
            fail(
                "sink",
                "--available-now runs one pass and exits; --trigger paces a query that runs "
                "until stopped: give one of them",
                EXIT_USAGE,
            )
        from rich.console import Console

        from pidfence.cli import preflight
        from pidfence.spark_sink import SinkOptions, object_store
        from pidfence.spark_sink import preflight as sink_preflight
        from pidfence.spark_sink import spark_checkpoint as sink_checkpoint
        from pidfence.spark_sink.data_loss import data_lost, lost_ranges
        from pidfence.spark_sink.pipeline import SESSION_CONF

        console = Console(highlight=False, soft_wrap=True)
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        flags = {
            "lifetime": lifetime,
            "capacity": None if capacity is None else str(capacity),
            "reorderWindow": None if reorder_window is None else str(reorder_window),
            "leasePublicKey": ",".join(key_paths(lease_public_key)) if lease_public_key else None,
            "recordMacSecret": record_mac_secret,
            "resolveGaps": None if resolve_gaps else "false",
            "leaseServer": lease_server,
        }
        sink_options = {k: v for k, v in flags.items() if v is not None}
        topics = [t.strip() for t in topic.split(",") if t.strip()]
        with exit_cleanly("sink"):
            sink_options |= named_options(option, sink_options)
            stores = apply_storage_options(storage_option)
            options = SinkOptions.parse({"path": output, **sink_options})
            options.certificates()  # the key files load (a usage error otherwise)
            options.record_macs()
            client = options.lease_client()  # the token and TLS files load
            if client is not None:
                from pidfence.spark_sink.authority import check_lifetime

                try:
                    check_lifetime(client, options.lifetime_ms)  # not shorter than the leases'
                finally:
                    client.close()
            found = preflight.check_kafka(bootstrap, topics)
            sink_preflight.check_apart(output, checkpoint)  # before either folder is made
            preflight.check_writable(output, "output")
            preflight.check_writable(checkpoint, "checkpoint")
            sink_preflight.check_output(options, checkpoint)
            starts = sink_checkpoint.start_offsets(
                checkpoint, found.watermarks, starting_offsets.value
            )
            lost = lost_ranges(starts, found.watermarks)
            if lost and not allow_data_loss:
                raise data_lost(lost)
            conf = {
                **SESSION_CONF,
                **object_store.session_conf((output, checkpoint), stores, master),
            }
        if warning := found.no_pf_warning:
            err.print(f"pidfence sink: warning: {warning}")
        if lease_server is None:
            from pidfence.spark_sink.authority import NO_AUTHORITY

            err.print(f"pidfence sink: {NO_AUTHORITY}")
        if lease_public_key and (warning := found.create_time_warning()):
            err.print(f"pidfence sink: warning: {warning}")
        if lost:
            gone = ", ".join(r.human() for r in lost)
            err.print(f"pidfence sink: warning: continuing after records Kafka deleted ({gone})")
        total = None
        if available_now:
            total = sink_preflight.records_to_read(found.watermarks, starts)
        metrics = None
        if metrics_port is not None:
            from pidfence.spark_sink.metrics import SinkMetrics

            metrics = SinkMetrics(output, bootstrap, topics, checkpoint, starts=starts)
            with exit_cleanly("sink"):
                console.print(f"metrics: {metrics.serve(metrics_port, metrics_host)}")

        log_file = None if verbose else spark_log_path(checkpoint)
        if log_file is not None:
            console.print(f"Spark and JVM log: {log_file}")
        try:
            summary = _run(
                console,
                master,
                bootstrap,
                topic,
                output,
                checkpoint,
                log_file,
                total,
                conf,
                available_now=available_now,
                trigger_seconds=trigger,
                starting_offsets=starting_offsets.value,
                sink_options=sink_options,
                allow_data_loss=allow_data_loss,
                tasks=tasks,
                jars=jars,
                metrics=metrics,
            )
        finally:
            if metrics is not None:
                metrics.close()
        dropped = sum(summary.dropped.values())
        console.print(
            f"committed {len(summary.batches)} batch(es): {summary.records_in:,} in → "
            f"{summary.appended:,} appended, {dropped:,} dropped"
        )


def _run(
    console: Any,
    master: str,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    log_file: Path | None,
    total: int | None,
    conf: dict[str, str],
    jars: Path | None = None,
    **kwargs: Any,
) -> Any:
    """Start Spark, serve the query with per-batch lines (and a bar when the total is known)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from pidfence.services import spark_session, stop_session
    from pidfence.services.spark import start_failure_is_transient
    from pidfence.spark_sink import BatchLine, serve
    from pidfence.wire import PidfenceError

    where = f" (details in {log_file})" if log_file is not None else ""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        console.print(f"{signal.Signals(signum).name}: stopping after this batch")
        stop.set()

    try:
        spark = spark_session(
            master=master,
            app_name=f"pidfence-sink-{topic}",
            conf=conf,
            log_file=log_file,
            jars=jars,
        )
    except PidfenceError as exc:  # no java, jars that cannot be had: the line names the fix
        fail("sink", first_line(exc), code_of(exc))
    except Exception as exc:  # noqa: BLE001 - any JVM start failure is one line
        # 75 promises that a rerun gets further: only for what passes (services.spark).
        code = EXIT_RETRIABLE if start_failure_is_transient(exc) else EXIT_UNAVAILABLE
        fail("sink", f"Spark did not start: {_line(exc)}{where}", code)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    bar = Progress(
        TextColumn("records"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    )
    task = bar.add_task("read", total=total or 0)

    def on_batch(line: BatchLine) -> None:
        bar.console.print(line.human())
        bar.advance(task, line.records_in)

    try:
        if total:
            bar.start()
        return serve(
            spark,
            bootstrap,
            topic,
            output,
            checkpoint,
            on_batch=on_batch,
            stop=stop,
            on_standby=lambda claim: console.print(
                f"{output} is held by another sink instance: {claim.owner()}. Waiting as a "
                "standby: this one takes over when that instance stops or its claim lapses "
                "(--option claimLapse=DURATION). To run both, give each its own --output and "
                "--checkpoint."
            ),
            **kwargs,
        )
    except PidfenceError as exc:
        # The sink's own error, found inside Spark's exception when the query ended on it, or
        # its output's store failing around the query (errors.OutputStoreFailed).
        details = f"; details in {log_file}" if log_file is not None else ""
        _stack(exc.__cause__, log_file)
        fail("sink", f"{first_line(exc)} ({type(exc).__name__}{details})", code_of(exc))
    except Exception as exc:  # noqa: BLE001 - before the query started (later ones are the sink's)
        _stack(exc, log_file)
        fail("sink", f"the Spark query did not start: {_line(exc)}{where}", EXIT_UNAVAILABLE)
    finally:
        bar.stop()
        with contextlib.suppress(Exception):  # a JVM that died: the failure above is the news
            stop_session(spark)


def _line(exc: BaseException) -> str:
    from pidfence.spark_sink.failure import summary

    return summary(exc)


def _stack(exc: BaseException | None, log_file: Path | None) -> None:
    """With ``--verbose`` (no log file), the whole failure (the Java stack) on stderr."""
    if exc is not None and log_file is None:
        sys.stderr.write("".join(traceback.format_exception(exc)))
