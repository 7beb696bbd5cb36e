"""``pidfence verify``: the checker of DESIGN §8 (logic in ``pidfence.verify``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

#: Exit codes: clean, anomalies found, unusable input.
EXIT_OK, EXIT_ANOMALIES, EXIT_BAD_INPUT = 0, 1, 2


def register(app: typer.Typer) -> None:
    """Add ``verify`` to the ``pidfence`` app."""

    @app.command("verify")
    def verify(
        ledger: Annotated[
            list[Path],
            typer.Option(
                help="Send ledger: a JSON-lines file or a folder of *.jsonl (repeatable)",
            ),
        ],
        output: Annotated[str, typer.Option(help="The sink's output path (its `path` option)")],
        rejects: Annotated[
            str | None, typer.Option(help="The sink's rejectsPath, if it was set")
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the report as JSON instead of a table")
        ] = False,
    ) -> None:
        """Compare the send ledger with the output log; exit 0 only when no anomaly is found.

        Exit 1 when any anomaly (lost, duplicate, reordered, zombie, unexpected, event_duplicate,
        event_lost) is non-zero,
        2 when an input is missing or unreadable.
        """
        code = run_verify(ledger, output, rejects, as_json)
        raise typer.Exit(code)


def run_verify(ledgers: list[Path], output: str, rejects: str | None, as_json: bool) -> int:
    """Read the inputs, run the checker, print the report; returns the exit code."""
    from rich.console import Console

    from pidfence.spark_sink import read_gaps, read_log, read_rejects
    from pidfence.verify import check, read_ledger
    from pidfence.verify.ledger import ledger_files

    try:
        files = ledger_files(ledgers)
        for path in ledgers:
            if path.is_dir() and not any(path.glob("*.jsonl")):
                return _bad(f"ledger folder {path} holds no *.jsonl file")
        if not files:
            return _bad("no ledger file given")
        for local in (output, rejects):
            if local is not None and "://" not in local and not Path(local).is_dir():
                return _bad(f"output path {local} does not exist or is not a folder")
        entries = list(read_ledger(files))
        log = read_log(output)
        rejected = read_rejects(output, rejects)
        report = check(entries, log, rejected, read_gaps(output))
    except (OSError, ValueError) as exc:
        return _bad(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        Console().print(report.render())
    return EXIT_OK if report.ok else EXIT_ANOMALIES


def _bad(message: str) -> int:
    sys.stderr.write(f"pidfence verify: error: {message}\n")
    return EXIT_BAD_INPUT
