"""Check a sink's output against send ledgers: read everything, then :func:`check` it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from pidfence.verify.check import CheckReport, check
from pidfence.verify.errors import OutputUnreadable, VerifyInputError


def verify_output(ledgers: Sequence[Path], output: str, rejects: str | None = None) -> CheckReport:
    """The checker's report for the sink output at ``output`` and the given ledgers.

    Rows other writers appended to a Delta output, and rows deleted from it after commit, are
    told apart with the sink's own account of its commits (``read_written``) and the table's
    history (a missing row is ``deleted`` only after a commit that removes rows, else ``lost``);
    every row in a data file the sink's commits added is the sink's (extra copies there are
    ``duplicate``, not ``foreign``).

    Args:
        ledgers: ledger files, or folders of ``*.jsonl``.
        output: the sink's ``path``.
        rejects: the sink's ``rejectsPath`` when it was set.

    Raises:
        VerifyInputError: a ledger is missing, empty (or torn lines only), unreadable or holds
            a line that is not a ledger entry (wrong field types included), or ``output`` is not
            there.
        NotPidfenceTable: ``output`` (or ``rejects``) holds something other than a pidfence
            table: no Delta table at all (say the folder above it), or another writer's.
        OutputUnreadable: reading the output failed (damaged files, storage errors).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    from pidfence.ledger import ledger_files
    from pidfence.spark_sink import read_gaps, read_log, read_rejects, read_written
    from pidfence.spark_sink.readers import FILE_COLUMN, read_data_files
    from pidfence.spark_sink.storage import Store
    from pidfence.verify.ledger_input import read_ledgers

    for path in ledgers:
        if path.is_dir() and not any(path.glob("*.jsonl")):
            raise VerifyInputError(f"ledger folder {path} holds no *.jsonl file")
    try:
        files = ledger_files(ledgers)
    except FileNotFoundError as exc:
        raise VerifyInputError(str(exc)) from exc
    if not files:
        raise VerifyInputError("no ledger file given (--ledger FILE or FOLDER)")
    for option, local in (("output", output), ("rejects", rejects)):
        if local is not None and "://" not in local and not Path(local).is_dir():
            raise VerifyInputError(f"{option} path {local} does not exist or is not a folder")
    _reach_stores(output, rejects)
    ledger = read_ledgers(files)
    try:
        _refuse_missing_tables(output, rejects)
        # Before the log: every sink batch this version holds had its manifest written first.
        read_version = DeltaTable(Store.at(output).uri).version()
        log, rejected = read_log(output, with_files=True), read_rejects(output, rejects)
        written = read_written(output, rejects)
        own_files = read_data_files(output)
        gaps = read_gaps(output)
        # After the log: every commit that removed a row the log lacks is in it.
        history = DeltaTable(Store.at(output).uri).history()
    except (OSError, pa.ArrowException, DeltaError) as exc:
        raise OutputUnreadable(f"cannot read the output at {output}: {exc}") from exc
    _refuse_missing_account(output, history, read_version)
    in_own_files = [f in own_files for f in log.column(FILE_COLUMN).to_pylist()]
    log = log.drop_columns([FILE_COLUMN])
    return check(ledger.entries, log, rejected, written, gaps, history, ledger.torn, in_own_files)


def _refuse_missing_tables(output: str, rejects: str | None) -> None:
    """Refuse an output whose tables are not there.

    The sink creates both tables before its first batch, so a pidfence output always holds
    them; the readers read a missing table as empty (the sink's own first read), which here
    would turn a wrong path (``out`` for ``out/log``) into every record ``lost``, or a pass.

    Raises:
        NotPidfenceTable: no Delta table at ``output`` or at the rejects path.
    """
    from pidfence.spark_sink.delta.errors import NotPidfenceTable
    from pidfence.spark_sink.delta.table import holds_delta
    from pidfence.spark_sink.options import rejects_path_of

    if not holds_delta(output):
        raise NotPidfenceTable(
            f"{output} is not a pidfence output: no Delta table there (--output is the sink's "
            "output path, the folder its Delta table is in, e.g. out/log, not the one above it)"
        )
    rejects_path = rejects_path_of(output, rejects)
    if not holds_delta(rejects_path):
        raise NotPidfenceTable(
            f"{rejects_path} is not a pidfence rejects table: no Delta table there "
            + (
                "(--rejects is the sink's rejectsPath option)"
                if rejects
                else "(the sink puts it there unless it ran with rejectsPath: give --rejects)"
            )
        )


def _refuse_missing_account(
    output: str, history: Sequence[dict[str, Any]], read_version: int
) -> None:
    """Refuse an output whose sink commits are in the table but whose own account is gone.

    Without ``_pidfence/`` (copied without it, deleted by hand) no row can be told the sink's,
    so every row would pass as another writer's and every acknowledged record be ``lost``: a
    verdict about the copy, not about the run.

    Raises:
        NotPidfenceTable: the history shows a sink batch and no batch manifest is there.
    """
    from pidfence.spark_sink.delta.errors import NotPidfenceTable
    from pidfence.spark_sink.delta.history import BATCH_KEY, is_batch_commit
    from pidfence.spark_sink.delta.table import OWN_DIR
    from pidfence.spark_sink.output import Output

    committed = [c for c in history if is_batch_commit(c) and int(c["version"]) <= read_version]
    if committed and next(iter(Output.reading(output).manifests()), None) is None:
        raise NotPidfenceTable(
            f"{output} holds sink batches (version {committed[0]['version']}: batch "
            f"{committed[0][BATCH_KEY]}) but not the sink's account of them: "
            f"{OWN_DIR}/ under it is missing or holds no batch manifest (copied or restored "
            f"without it?), so its rows cannot be told from other writers'; verify the "
            f"original output, or restore {OWN_DIR}/ with the table"
        )


def _reach_stores(*paths: str | None) -> None:
    """A missing bucket, refused credentials or no store at the endpoint, said with its fix
    before any read (delta-rs would only say "Generic S3 error").

    Raises:
        OutputUnreadable: an ``s3://`` path's store cannot be used.
    """
    from pidfence.spark_sink.s3_requests import StoreUnusable, reach_stores

    try:
        reach_stores(*paths)
    except StoreUnusable as exc:
        raise OutputUnreadable(f"cannot read the output: {exc}") from exc
    except ModuleNotFoundError:
        # boto3 comes with the sink extra, not verify's: the read below names what fails.
        return


__all__ = ["verify_output"]
