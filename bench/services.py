"""``pidfence bench services``: seconds until each embedded service is ready.

Ready means what the fixtures and ``pidfence services up`` wait for: a ZooKeeper node serves a znode
write and read through kazoo; every Kafka node answers metadata and sees itself in the cluster; a
SparkSession (with the Kafka connector jars) answers a first query.

Cold: a fresh run dir (ZooKeeper and Kafka format new data dirs; Kafka runs its storage tool).
Warm: the same nodes stopped and started again on the data they wrote (Kafka and ZooKeeper recover
their logs). For Spark, cold is the first driver process with fresh scratch dirs and warm is a
second one. The OS page cache is never dropped (other users share the machine), so "cold" means
cold for pidfence's own state, not for the jars on disk. ``--quick`` runs each case once; the full
run takes the median of three.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.services import KafkaCluster, ZooKeeperEnsemble

_SPARK_PROBE = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    from pidfence.services import spark_session
    spark = spark_session(master="local[2]", conf={"spark.local.dir": sys.argv[1]})
    if (counted := spark.range(10).count()) != 10:
        raise RuntimeError(f"the Spark session counted {counted} of 10 rows")
    print(json.dumps({"ready_s": time.perf_counter() - started}))
    spark.stop()
    """
)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def zookeeper_cold_warm(size: int) -> tuple[float, float]:
    """Seconds to ready for a new ensemble, then for the same ensemble restarted."""
    run_dir = Path(tempfile.mkdtemp(prefix="pidfence-bench-zk-"))
    ensemble = ZooKeeperEnsemble(size, run_dir=run_dir)
    try:
        cold = _timed(ensemble.start)
        for node in ensemble.nodes:
            node.stop()

        def warm_start() -> None:
            for node in ensemble.nodes:
                node.start()
            for i in range(size):
                ensemble.wait_ready(i, 90)

        warm = _timed(warm_start)
    finally:
        ensemble.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return cold, warm


def kafka_cold_warm(size: int) -> tuple[float, float]:
    """Seconds to ready for a new cluster (storage format included), then restarted."""
    run_dir = Path(tempfile.mkdtemp(prefix="pidfence-bench-kafka-"))
    cluster = KafkaCluster(size, run_dir=run_dir, heap="384m")
    try:
        cold = _timed(cluster.start)
        for node in cluster.nodes:
            node.stop(timeout=30)

        def warm_start() -> None:
            for node in cluster.nodes:
                node.start()
            cluster.wait_ready(180)

        warm = _timed(warm_start)
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return cold, warm


def spark_ready() -> float:
    """Seconds from importing pidfence.services to a first answered query, in a new driver."""
    scratch = Path(tempfile.mkdtemp(prefix="pidfence-bench-spark-"))
    try:
        result = subprocess.run(
            [sys.executable, "-c", _SPARK_PROBE, str(scratch)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
            cwd=scratch,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ready: float = json.loads(result.stdout.strip().splitlines()[-1])["ready_s"]
    return ready


def spark_cold_warm() -> tuple[float, float]:
    """Seconds to ready for a first Spark driver and for a second one."""
    return spark_ready(), spark_ready()


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the services benchmark."""
    repeats = 1 if quick else 3
    cases: list[tuple[str, int, Callable[[], tuple[float, float]]]] = [
        ("ZooKeeper", 1, lambda: zookeeper_cold_warm(1)),
        ("ZooKeeper", 3, lambda: zookeeper_cold_warm(3)),
        ("Kafka (KRaft)", 1, lambda: kafka_cold_warm(1)),
        ("Kafka (KRaft)", 3, lambda: kafka_cold_warm(3)),
        ("Spark session local[2]", 1, spark_cold_warm),
    ]
    task = progress.add_task("services", total=len(cases) * repeats)
    rows = []
    for service, nodes, measure in cases:
        colds: list[float] = []
        warms: list[float] = []
        for _ in range(repeats):
            progress.update(task, description=f"{service} x{nodes}")
            cold, warm = measure()
            colds.append(cold)
            warms.append(warm)
            progress.advance(task)
        rows.append(
            {
                "service": service,
                "nodes": nodes,
                "cold s": round(statistics.median(colds), 2),
                "warm s": round(statistics.median(warms), 2),
                "cold runs": [round(c, 2) for c in colds],
                "warm runs": [round(w, 2) for w in warms],
            }
        )
    return BenchReport(
        title="seconds until ready (kazoo write, every broker in metadata, first Spark query)",
        columns=["service", "nodes", "cold s", "warm s"],
        rows=rows,
        params={"repeats": repeats, "statistic": "median"},
        notes=[
            "cold: fresh run dir (new data dirs, Kafka storage format); warm: same nodes restarted",
            "Spark: cold = first driver process, warm = a second one (JVM start both times)",
            "OS page cache not dropped: jars on disk are warm in both columns",
        ],
    )
