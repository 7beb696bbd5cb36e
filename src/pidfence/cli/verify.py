"""``pidfence verify``: the checker of DESIGN §8 (logic in ``pidfence.verify``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli.exits import EXIT_ANOMALIES, EXIT_OK, EXIT_USAGE, exit_cleanly, fail
from pidfence.cli.extras import require
from pidfence.cli.storage import StorageOption, apply_storage_options


def register(app: typer.Typer) -> None:
    """Add ``verify`` to the ``pidfence`` app."""

    @app.command("verify")
    def verify(
        # Text, not Path: Path("") is ".", so an empty --ledger would read the working folder.
        ledger: Annotated[
            list[str],
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
        storage_option: StorageOption = None,
    ) -> None:
        """Compare the send ledger with the output log; exit 0 only when no anomaly is found.

        Exit 1 when any anomaly (lost, duplicate, reordered, zombie, unexpected, event_duplicate,
        event_lost) is non-zero; 2 when a ledger is missing, unreadable, empty (or torn lines
        only) or holds a line that is not a ledger entry (a field of the wrong type included:
        the line names file:line), a path given is empty, or a local output path is missing; 3
        when the verify extra is missing, the output cannot be read (its store unreachable, a
        bucket missing) or is not a pidfence output (no Delta table at --output, say the folder
        above the sink's path; another writer's table; a kind of table this version does not
        write; sink batches without the sink's own _pidfence/ folder beside them).

        Rows other writers appended to a Delta output are counted for information (foreign).
        A row the sink wrote that the table no longer holds is deleted (information) only when
        the table's history shows a commit after the sink's that removes rows (DELETE, MERGE,
        UPDATE, RESTORE, an overwrite); otherwise it is lost (a history cleaned past its
        delta.logRetentionDuration shows no such commit). A row whose value was changed in
        place after such a commit is updated (information), judged by the value the sink
        wrote. Torn ledger lines (a writer killed
        mid-line) are counted (torn): their records are not claimed as sent. With the default
        event id (the value digest), distinct sends of equal bytes are one event.
        """
        _refuse_empty_paths(ledger, output, rejects)
        require("verify", "verify")
        with exit_cleanly("verify"):
            apply_storage_options(storage_option)
        code = run_verify([Path(p) for p in ledger], output, rejects, as_json)
        raise typer.Exit(code)


def _refuse_empty_paths(ledgers: list[str], output: str, rejects: str | None) -> None:
    """Exit 2 naming the option when a path given to it is empty (``--output ""``).

    Read on, an empty output is a store holding no table (exit 3) and an empty ledger the
    working folder: both are a command line to fix.
    """
    given = [("--ledger", p) for p in ledgers] + [("--output", output), ("--rejects", rejects)]
    for option, path in given:
        if path is not None and not path.strip():
            fail("verify", f"{option} is empty: give the path", EXIT_USAGE)


def run_verify(ledgers: list[Path], output: str, rejects: str | None, as_json: bool) -> int:
    """Run the checker and print its report; returns the exit code (errors exit from here)."""
    from rich.console import Console

    from pidfence.verify import verify_output

    with exit_cleanly("verify"):
        report = verify_output(ledgers, output, rejects)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        Console().print(report.render())
    return EXIT_OK if report.ok else EXIT_ANOMALIES
