"""``pidfence bench NAME [--quick]``: run ``bench/NAME.py`` and record its figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
        """Run a benchmark, print its table and write bench/results/NAME.json.

        Exit 1 when the bench's own check fails (a soak with anomalies), after writing it."""
        from pidfence.benchkit import BenchNotFound, run_bench

        if store is not None:
            name = f"{name}_{store}"
        try:
            report = run_bench(name, quick=quick, bench_dir=bench_dir)
        except BenchNotFound as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from exc
        if report.failed is not None:
            typer.echo(f"pidfence bench {name}: failed: {report.failed}", err=True)
            raise typer.Exit(1)
