"""What ``pidfence produce`` and ``pidfence copy`` share: their producer options, one way to
open the producer they run, and how they report a failure (one line, a meaningful exit)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, code_of
from pidfence.cli.keys import producer_public_keys
from pidfence.cli.lease import parse_duration_ms
from pidfence.wire import PidfenceError

R = TypeVar("R")
#: Reports how many records are done.
OnProgress = Callable[[int], None]

Bootstrap = Annotated[str, typer.Option(help="Kafka bootstrap servers HOST:PORT[,...]")]
LeaseServers = Annotated[
    str, typer.Option("--lease-server", help="Lease servers HOST:PORT[,HOST:PORT]")
]
CheckpointEvery = Annotated[int, typer.Option(min=1, help="Flush and save --state every N records")]
Ledger = Annotated[
    Path | None, typer.Option(help="Send ledger (JSON lines) of acknowledged records")
]
MessageTimeout = Annotated[
    str | None,
    typer.Option(
        "--message-timeout",
        metavar="DURATION",
        help="librdkafka message.timeout.ms as a duration (e.g. 2s, 500ms; default 5m): keep it "
        "below the rollover margin (1/24 of the lease lifetime by default)",
    ),
]


#: What a retriable failure of a run that cannot resume says instead of promising a rerun.
NOT_RESUMABLE = (
    "retriable, but without --state a rerun would start over from the first record under a new "
    "pid and send every record again: use --state FILE to resume"
)


@contextmanager
def fail_cleanly(resumable: bool | Callable[[], bool] = True) -> Iterator[None]:
    """Turn a :class:`PidfenceError` into one stderr line, naming its class (the producer's
    documented errors), and its exit code by :data:`~pidfence.cli.exits.EXIT_BY_ERROR`.

    Args:
        resumable: whether running the same command again continues (or a function asked when
            the error comes); when not, a retriable error exits 3, not 75 (75 promises that a
            rerun continues), and the line says so.
    """
    try:
        yield
    except PidfenceError as exc:
        code = code_of(exc)
        note = ""
        if code == EXIT_RETRIABLE and not (resumable() if callable(resumable) else resumable):
            code, note = EXIT_UNAVAILABLE, f" ({NOT_RESUMABLE})"
        kind = "retriable" if code == EXIT_RETRIABLE else "error"
        sys.stderr.write(f"pidfence: {kind}: {type(exc).__name__}: {exc}{note}\n")
        raise SystemExit(code) from exc


def with_progress(columns: Sequence[Any], total: int | None, job: Callable[[OnProgress], R]) -> R:
    """Run ``job(update)`` under a progress display; ``update(done)`` moves it."""
    from rich.progress import Progress

    with Progress(*columns) as display:
        task = display.add_task("", total=total)
        return job(lambda done: display.update(task, completed=done))


def with_producer(
    bootstrap: str,
    lease_server: str,
    *,
    topic: str,
    ledger: Path | None,
    lease_public_key: list[str] | None,
    message_timeout: str | None,
    run: Callable[[Any], R],
    opener: Callable[..., Any] | None = None,
    resumable: bool | Callable[[], bool] = True,
    **config: Any,
) -> R:
    """Build the producer settings, connect to the lease servers and call ``run(open)``,
    where ``open(checkpoint or None)`` leases a fresh producer or resumes one that writes
    ``topic``; a :class:`PidfenceError` becomes one line and an exit code.

    Args:
        bootstrap: Kafka bootstrap servers.
        lease_server: lease servers; token and TLS come from ``$PIDFENCE_LEASE_TOKEN_FILE`` /
            ``_TOKEN`` / ``_TLS_CA`` (never argv).
        topic: the topic the producer writes (a resume fences and scans it).
        ledger: the send ledger, or None.
        lease_public_key: ``--lease-public-key`` values.
        message_timeout: ``--message-timeout``, or None for the default.
        run: what the command does with its ``open_producer``.
        opener: ``f(settings, client, ledger=, topics=)`` -> what ``run`` gets (default:
            :func:`~pidfence.producer.opening.open_producer_factory`).
        resumable: whether a rerun continues where this run stopped, or a function asked when
            an error comes (``produce`` without ``--state`` starts over, which continues only
            while it has sent nothing): if not, a retriable error exits 3, not 75.
        **config: more :class:`~pidfence.producer.ProducerConfig` fields.
    """
    from pidfence.pid_allocator import LeaseClient, lease_client_options
    from pidfence.producer import ProducerConfig
    from pidfence.producer.opening import open_producer_factory

    opener = opener or open_producer_factory

    with fail_cleanly(resumable):
        if message_timeout is not None:
            config["message_timeout_ms"] = parse_duration_ms(message_timeout)
        settings = ProducerConfig(
            bootstrap, lease_public_keys=producer_public_keys(lease_public_key), **config
        )
        with LeaseClient(lease_server, **lease_client_options()) as client:
            return run(opener(settings, client, ledger=ledger, topics=[topic]))
