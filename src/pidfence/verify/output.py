"""Check a sink's output against send ledgers: read everything, then :func:`check` it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from pidfence.verify.check import CheckReport, check
from pidfence.verify.errors import OutputUnreadable, VerifyInputError


def verify_output(ledgers: Sequence[Path], output: str, rejects: str | None = None) -> CheckReport:
    """The checker's report for the sink output at ``output`` and the given ledgers.

    Rows other writers appended to a Delta output, and rows deleted from it after commit, are
    told apart with the sink's own account of its commits (``read_written``).

    Args:
        ledgers: ledger files, or folders of ``*.jsonl``.
        output: the sink's ``path``.
        rejects: the sink's ``rejectsPath`` when it was set.

    Raises:
        VerifyInputError: a ledger is missing, empty or unreadable, or ``output`` is not there.
        NotPidfenceTable: ``output`` holds something other than a pidfence output.
        OutputUnreadable: reading the output failed (damaged files, storage errors).
    """
    from deltalake.exceptions import DeltaError

    from pidfence.ledger import ledger_files, read_ledger
    from pidfence.spark_sink import read_gaps, read_log, read_rejects, read_written

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
    try:
        entries = list(read_ledger(files))
    except (OSError, ValueError) as exc:
        raise VerifyInputError(f"cannot read the ledger: {exc}") from exc
    try:
        log, rejected = read_log(output), read_rejects(output, rejects)
        written = read_written(output, rejects)
        gaps = read_gaps(output)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        raise OutputUnreadable(f"cannot read the output at {output}: {exc}") from exc
    return check(entries, log, rejected, written, gaps)


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


__all__ = ["verify_output"]
