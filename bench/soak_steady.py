"""``pidfence bench soak_steady``: the soak with one sink instance for 2 hours (``--quick``: 3
minutes), never restarted, on a 0.5 s trigger: batch time, state and the files under the output's
``_pidfence/`` and ``_delta_log/`` sampled every minute, with their slopes; zero anomalies
required. The producers' faults (kill and resume, zombie, lease-zombie, re-sends) still run every
5 minutes. ``PIDFENCE_SOAK_MINUTES`` overrides the duration, ``PIDFENCE_SOAK_OUT`` keeps the run's
files. The plot goes to ``bench/results/soak_steady.png`` (``soak_steady-quick.png`` for ``--quick``
or a ``PIDFENCE_SOAK_MINUTES`` run, beside ``soak_steady-quick.json``).
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench, partial_run
from pidfence.demo.soak.config import config_from_env

RESULTS = Path(__file__).resolve().parent / "results"


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the steady soak (starts and stops its own services)."""
    plot = RESULTS / ("soak_steady-quick.png" if partial_run(quick) else "soak_steady.png")
    soak = load_bench("soak", Path(__file__).resolve().parent)
    report: BenchReport = soak.soak_bench(config_from_env(quick, plot, steady=True), progress)
    return report
