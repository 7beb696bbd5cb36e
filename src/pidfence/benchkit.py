"""The benchmark runner behind ``pidfence bench``.

A benchmark is ``bench/NAME.py`` with ``def run(quick: bool, progress: Progress) -> BenchReport``
(other ``bench/*.py`` files are scripts run with ``python``, or helpers named ``_*.py``). The
runner prints the report as a table and writes ``bench/results/NAME.json`` with the machine, the
versions, the settings and every figure, so a number in the README always has a file and a
command behind it. A ``--quick`` run, or one with any setting from the environment
(``PIDFENCE_BENCH_*``, ``PIDFENCE_SOAK_MINUTES``), writes ``NAME-quick.json`` instead: only a full
run with the defaults replaces the figures a full run recorded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pidfence.lifecycle import signals_raise
from pidfence.wire import PidfenceError

_VERSIONED = ("pidfence", "confluent-kafka", "kazoo", "msgpack", "numpy", "pyarrow", "pyspark")
#: Environment variables that change what a bench runs: every one starting with this prefix...
SETTINGS_PREFIX = "PIDFENCE_BENCH_"
#: ...and these (the soak's length).
SETTINGS_NAMES = ("PIDFENCE_SOAK_MINUTES",)
_HAS_RUN = re.compile(r"^def run\(", re.MULTILINE)


class BenchNotFound(PidfenceError):
    """No ``bench/NAME.py`` where the runner looked, or it is no benchmark (no ``run``)."""


class BadBenchSetting(PidfenceError, ValueError):
    """A ``PIDFENCE_BENCH_*`` setting the bench cannot run with (raised before it starts
    anything)."""


class BenchStopped(BaseException):
    """SIGTERM stopped the run; it unwinds like Ctrl-C (every ``finally`` stops what it started).

    A BaseException, like :class:`KeyboardInterrupt`, so no ``except Exception`` swallows it;
    ``exit_code`` is 128 + the signal's number (143).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


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

    def check(self, misses: Sequence[str], passed: str) -> BenchReport:
        """Record the bench's own check: a note (``passed``, or every miss), and ``failed``
        when anything missed (the figures are still written; ``pidfence bench`` exits 1)."""
        if misses:
            self.failed = "; ".join(misses)
            self.notes.append(f"FAILED: {self.failed}")
        else:
            self.notes.append(passed)
        return self


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


def bench_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of this run from the environment (``PIDFENCE_BENCH_*``,
    ``PIDFENCE_SOAK_MINUTES``), the empty ones left out (they mean the default)."""
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(env.items())
        if (k.startswith(SETTINGS_PREFIX) or k in SETTINGS_NAMES) and v.strip()
    }


def partial_run(quick: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a run is not the full run with the defaults: ``--quick`` or any setting."""
    return quick or bool(bench_settings(environ))


def result_path(bench_dir: Path, name: str, quick: bool, settings: Mapping[str, str]) -> Path:
    """``results/NAME.json`` for a full run with the defaults, else ``results/NAME-quick.json``."""
    stem = f"{name}-quick" if quick or settings else name
    return bench_dir / "results" / f"{stem}.json"


def command_line(name: str, quick: bool, settings: Mapping[str, str]) -> str:
    """The shell command that repeats a run, its settings first."""
    env = [f"{k}={shlex.quote(v)}" for k, v in settings.items()]
    return " ".join([*env, "pidfence", "bench", name, *(["--quick"] if quick else [])])


def benchmarks(bench_dir: Path) -> list[str]:
    """The benchmarks in ``bench_dir``: ``NAME.py`` files (not ``_*.py``) that define ``run``."""
    return sorted(
        p.stem
        for p in bench_dir.glob("*.py")
        if not p.stem.startswith("_") and _HAS_RUN.search(p.read_text())
    )


def load_bench(name: str, bench_dir: Path) -> Any:
    """Import ``bench_dir/NAME.py`` as a module (a benchmark or one of its helpers)."""
    path = bench_dir / f"{name}.py"
    if not path.is_file():
        known = ", ".join(benchmarks(bench_dir)) if bench_dir.is_dir() else "none"
        raise BenchNotFound(f"no benchmark {name!r} in {bench_dir} (known: {known})")
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
    """Run ``bench/NAME.py``, print its table and write ``bench/results/NAME.json`` (a partial
    run: ``NAME-quick.json``, see :func:`result_path`).

    Raises:
        BenchNotFound: no such file, or it is a script without ``run``.
        BadBenchSetting: a setting the bench refused before starting anything.
    """
    bench_dir = bench_dir or default_bench_dir()
    path = bench_dir / f"{name}.py"
    if path.is_file() and not name.startswith("_") and not _HAS_RUN.search(path.read_text()):
        raise BenchNotFound(
            f"{path} is a script, not a benchmark (no run()): run it with python {path} "
            f"(benchmarks: {', '.join(benchmarks(bench_dir))})"
        )
    module = load_bench(name, bench_dir)
    if not callable(getattr(module, "run", None)):
        raise BenchNotFound(f"{path} defines no run(quick, progress): it is no benchmark")
    settings = bench_settings()
    console = Console(width=max(140, Console().width))
    started = time.time()
    with Progress(console=console, transient=True) as progress:
        report: BenchReport = module.run(quick=quick, progress=progress)
    elapsed = time.time() - started
    render(report, console)
    out = result_path(bench_dir, name, quick, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = _previous_run(out)
    payload = {
        "bench": name,
        "command": command_line(name, quick, settings),
        "quick": quick,
        "settings": settings,
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
    keep = ("command", "settings", "finished_at", "elapsed_s", "rows", "notes", "params", "failed")
    return {k: last[k] for k in keep if k in last}


def stopped_by_sigterm() -> AbstractContextManager[None]:
    """Within: SIGTERM raises :class:`BenchStopped`, so the run unwinds through its ``finally``
    blocks and stops every service it started (:func:`~pidfence.lifecycle.signals_raise`)."""
    return signals_raise((signal.SIGTERM,), BenchStopped)
