"""The benchmark runner behind ``pidfence bench``.

A benchmark is ``bench/NAME.py`` with ``def run(quick: bool, progress: Progress) -> BenchReport``.
The runner prints the report as a table and writes ``bench/results/NAME.json`` with the machine,
the versions and every figure, so a number in the README always has a file and a command behind it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pidfence.wire import PidfenceError

_VERSIONED = ("pidfence", "confluent-kafka", "kazoo", "msgpack", "numpy", "pyarrow", "pyspark")


class BenchNotFound(PidfenceError):
    """No ``bench/NAME.py`` where the runner looked."""


@dataclass
class BenchReport:
    """What one benchmark measured: rows of figures (one row per contender) plus notes; the
    columns are the first row's keys unless named."""

    title: str
    rows: list[dict[str, Any]]
    columns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    #: Why the run failed its bench's own check (a soak with anomalies): ``pidfence bench``
    #: then exits 1 after writing the figures. None: it passed, or has no such check.
    failed: str | None = None

    def __post_init__(self) -> None:
        if not self.columns and self.rows:
            self.columns = list(self.rows[0])


def machine_facts() -> dict[str, Any]:
    """Machine and version facts stored beside every figure."""
    versions: dict[str, str] = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or "unknown",
        "versions": versions,
    }


def default_bench_dir() -> Path:
    """``./bench`` if present, else the ``bench`` folder of the source checkout."""
    here = Path.cwd() / "bench"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str, bench_dir: Path) -> Any:
    """Import ``bench_dir/NAME.py`` as a module."""
    path = bench_dir / f"{name}.py"
    if not path.is_file():
        known = sorted(p.stem for p in bench_dir.glob("*.py") if not p.stem.startswith("_"))
        raise BenchNotFound(f"no benchmark {name!r} in {bench_dir} (known: {', '.join(known)})")
    spec = importlib.util.spec_from_file_location(f"pidfence_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise BenchNotFound(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def render(report: BenchReport, console: Console) -> None:
    """Print a report as a rich table."""
    table = Table(title=report.title)
    for column in report.columns:
        table.add_column(column, justify="left" if column == report.columns[0] else "right")
    for row in report.rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in report.columns))
    console.print(table)
    for note in report.notes:
        console.print(f"  {note}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def run_bench(name: str, *, quick: bool, bench_dir: Path | None = None) -> BenchReport:
    """Run ``bench/NAME.py``, print its table and write ``bench/results/NAME.json``."""
    bench_dir = bench_dir or default_bench_dir()
    module = load_bench(name, bench_dir)
    console = Console(width=max(140, Console().width))
    started = time.time()
    with Progress(console=console, transient=True) as progress:
        report: BenchReport = module.run(quick=quick, progress=progress)
    elapsed = time.time() - started
    render(report, console)
    out = bench_dir / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = _previous_run(out)
    payload = {
        "bench": name,
        "command": f"pidfence bench {name}" + (" --quick" if quick else ""),
        "quick": quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "elapsed_s": round(elapsed, 2),
        "machine": machine_facts(),
        **asdict(report),
        # The run before this one, so every figure is read beside its previous value.
        "previous": previous,
    }
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    console.print(f"wrote {out}")
    return report


def _previous_run(path: Path) -> dict[str, Any] | None:
    """The figures of the last recorded run of a bench (without its own history), if readable."""
    try:
        last = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(last, dict):
        return None
    keep = ("command", "finished_at", "elapsed_s", "rows", "notes", "params")
    return {k: last[k] for k in keep if k in last}
