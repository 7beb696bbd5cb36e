"""``pidfence bench NAME [--quick]``: run ``bench/NAME.py`` and record its figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the ``pidfence`` app."""

    @app.command("bench")
    def bench(
        name: Annotated[str, typer.Argument(help="Benchmark to run: bench/NAME.py")],
        quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes, same figures")] = False,
        bench_dir: Annotated[
            Path | None, typer.Option(help="Folder holding the benchmarks (default: ./bench)")
        ] = None,
        store: Annotated[
            str | None,
            typer.Option(help="Run bench/NAME_STORE.py: e.g. `sink --store s3` writes to S3"),
        ] = None,
    ) -> None:
        """Run a benchmark, print its table and write bench/results/NAME.json
        (NAME-quick.json for --quick or with PIDFENCE_BENCH_* settings in the environment).

        Exit 1 when the bench's own check fails (a soak with anomalies, a sink that wrote the
        wrong number of rows), after writing it; 2 for an unknown bench or a bad setting; 130
        on Ctrl-C and 143 on SIGTERM, after stopping every service the bench started."""
        from pidfence.benchkit import (
            BadBenchSetting,
            BenchNotFound,
            BenchStopped,
            run_bench,
            stopped_by_sigterm,
        )

        if store is not None:
            name = f"{name}_{store}"
        try:
            with stopped_by_sigterm():
                report = run_bench(name, quick=quick, bench_dir=bench_dir)
        except (BenchNotFound, BadBenchSetting) as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from exc
        except KeyboardInterrupt:
            _stopped(name, "interrupted (SIGINT)", 130)
        except BenchStopped as exc:
            _stopped(name, f"stopped by {exc}", exc.exit_code)
        if report.failed is not None:
            typer.echo(f"pidfence bench {name}: failed: {report.failed}", err=True)
            raise typer.Exit(1)


def _stopped(name: str, how: str, code: int) -> NoReturn:
    """One stderr line for a run a signal stopped, then 128 + the signal."""
    sys.stderr.write(f"pidfence bench {name}: {how}: the services it started were stopped\n")
    sys.stderr.flush()
    raise typer.Exit(code)
