"""``pidfence bench sink_standalone64``: ``bench/sink.py`` with 64 partitions on Spark standalone.

The same raw topic shape and contenders as ``pidfence bench sink`` (see there), over 64 Kafka
partitions, read by a Spark standalone cluster of one master and two one-core workers that the
bench starts and stops (the driver runs in this process). Its own bench name keeps its figures in
``bench/results/sink_standalone64.json`` (``sink_standalone64-quick.json`` for ``--quick`` or with
settings), beside rather than over the local run's.
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in its ``standalone64`` mode."""
    sink = load_bench("sink", Path(__file__).resolve().parent)
    report: BenchReport = sink.run_mode(sink.STANDALONE64, quick, progress)
    return report
