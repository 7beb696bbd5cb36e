"""``pidfence sink compact`` and ``pidfence sink vacuum``: care of the sink's Delta tables.

A failure is one line and an exit code (:func:`care_exit`): a retention below the table's
minimum is a usage error (2); a commit another writer beat, or a store that failed a request,
passes (75: the same command run again continues); anything else is met again (3).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Final

import typer

from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, EXIT_USAGE, exit_cleanly, fail
from pidfence.cli.storage import StorageOption, apply_storage_options

if TYPE_CHECKING:
    from pidfence.spark_sink.delta.table import TableKind

#: The output a care command (compact, vacuum) works on, and its rejects table.
DeltaOutput = Annotated[str, typer.Argument(help="The sink's output path")]
RejectsPath = Annotated[str | None, typer.Option(help="The rejects table (default PATH/_rejects)")]

#: deltalake's refusal of a vacuum retention below the table's (it names no class of its own).
_RETENTION: Final = re.compile(r"Invalid retention period|minimum retention", re.IGNORECASE)
#: A store or folder that refuses this user, or is read-only: a rerun is refused again.
_REFUSED: Final = re.compile(
    r"Permission denied|Read-only file system|AccessDenied|Forbidden|\b403\b|os error (?:1|13|30)\b"
)
#: Terminal colours and the arrows delta-rs draws between the causes of an error.
_DECORATION: Final = re.compile(r"\x1b\[[0-9;]*m|↳")


def care_exit(exc: BaseException) -> int:
    """The exit code of a compact or vacuum that ``exc`` (deltalake's, or the store's
    ``OSError``) stopped: 2 for the retention refusal, 75 for a commit conflict or a store that
    failed, 3 for anything a rerun meets again."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    if isinstance(exc, DeltaError) and _RETENTION.search(str(exc)):
        return EXIT_USAGE
    if isinstance(exc, CommitFailedError):
        return EXIT_RETRIABLE
    if isinstance(exc, OSError) and not (
        isinstance(exc, PermissionError) or _REFUSED.search(str(exc))
    ):
        return EXIT_RETRIABLE
    return EXIT_UNAVAILABLE


def cause(exc: BaseException) -> str:
    """An error's message on one line (delta-rs spreads its causes over several)."""
    text = " ".join(_DECORATION.sub(" ", str(exc)).split())
    return text[:400] or type(exc).__name__


@contextmanager
def _care(command: str, what: str) -> Iterator[None]:
    """deltalake's errors and the store's ``OSError`` in the block as one line naming ``what``,
    with their exit code (:func:`care_exit`)."""
    from deltalake.exceptions import DeltaError

    try:
        yield
    except (DeltaError, OSError) as exc:
        code = care_exit(exc)
        again = "; run the same command again, it continues" if code == EXIT_RETRIABLE else ""
        fail(command, f"{what}: {cause(exc)}{again}", code)


def _tables(
    command: str, path: str, rejects_path: str | None, storage_options: list[str] | None
) -> list[tuple[TableKind, str]]:
    """The output's tables, (kind, path), with the store's options applied and reached."""
    from pidfence.spark_sink.delta import care
    from pidfence.spark_sink.s3_requests import reach_stores

    apply_storage_options(storage_options)
    reach_stores(path, rejects_path)
    with _care(command, path):
        return care.tables_of(path, rejects_path)


def register_care(group: typer.Typer) -> None:
    """``sink compact`` and ``sink vacuum``: care of a Delta output."""

    @group.command("compact")
    def compact(
        path: DeltaOutput,
        rejects_path: RejectsPath = None,
        target_size: Annotated[
            int | None, typer.Option(min=1, help="Target file size in bytes (default ~100 MB)")
        ] = None,
        storage_option: StorageOption = None,
    ) -> None:
        """Rewrite the small files of committed batches into big ones (log and rejects tables).

        Readers see the same rows; files of uncommitted batches are never touched; the
        replaced files stay until a vacuum after the retention period. Safe while the sink runs.
        Exit 3 when PATH is not a pidfence Delta output or a file its table adds was deleted
        outside Delta, 75 when another writer's commit came first, a vacuum deleted files of the
        version it read, or the store failed (run it again).
        """
        from pidfence.spark_sink.delta import care

        command = "sink compact"
        with exit_cleanly(command):
            for kind, where in _tables(command, path, rejects_path, storage_option):
                with _care(command, f"{kind} {where}"):
                    metrics = care.compact(where, kind, target_size=target_size)
                typer.echo(
                    f"{kind} {where}: {metrics.get('numFilesRemoved', 0)} files → "
                    f"{metrics.get('numFilesAdded', 0)}"
                )

    @group.command("vacuum")
    def vacuum(
        path: DeltaOutput,
        rejects_path: RejectsPath = None,
        retention_hours: Annotated[
            int | None,
            typer.Option(min=0, help="Keep removed files this long (default: 7 days)"),
        ] = None,
        full: Annotated[
            bool,
            typer.Option(
                "--full", help="Also delete files no commit added (except uncommitted batches')"
            ),
        ] = False,
        bookkeeping_age: Annotated[
            int,
            typer.Option(
                min=0, help="Delete unneeded files under PATH/_pidfence once this old (minutes)"
            ),
        ] = 60,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list")] = False,
        storage_option: StorageOption = None,
    ) -> None:
        """Delete files the log and rejects tables no longer need (after compaction), and the
        sink's own files under PATH/_pidfence that no retained batch or running sink reads.

        Never deletes a file of a batch that is not committed yet, nor one of a sink instance
        that claimed the output after the vacuum began. A retention below the table's (7 days)
        breaks readers of older versions and is refused (exit 2). Safe while the sink runs. Exit
        3 when PATH is not a pidfence Delta output, 75 when the store failed (run it again).
        """
        from pidfence.spark_sink.delta import care
        from pidfence.spark_sink.sweep import sweep

        command = "sink vacuum"
        verb = "would delete" if dry_run else "deleted"
        with exit_cleanly(command):
            for kind, where in _tables(command, path, rejects_path, storage_option):
                with _care(command, f"{kind} {where}"):
                    gone = care.vacuum(
                        where, kind, retention_hours=retention_hours, full=full, dry_run=dry_run
                    )
                typer.echo(f"{kind} {where}: {verb} {len(gone)} files")
                for rel in gone if dry_run else []:
                    typer.echo(f"  {rel}")
            bookkeeping = f"bookkeeping {path.rstrip('/')}/_pidfence"
            with _care(command, bookkeeping):
                swept = sweep(path, bookkeeping_age * 60.0, dry_run)
            typer.echo(f"{bookkeeping}: {verb} {len(swept)} files")
            for rel in swept if dry_run else []:
                typer.echo(f"  {rel}")
