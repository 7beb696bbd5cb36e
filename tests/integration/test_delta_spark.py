"""Spark reads the pidfence Delta table with ``delta-spark`` (``spark.read.format("delta")``).

``io.delta:delta-spark_2.13:4.4.0`` is the delta-spark release built against Spark 4.2.0. The
jars come from ``$PIDFENCE_DELTA_JARS`` or the jar cache's ``delta/`` directory (the ``delta``
module of ``infra/jvm``); only ``delta-spark`` and ``delta-storage`` are put on the classpath,
the rest is pyspark's own. The session runs in a child process: Delta needs its session
extension and catalog set before the JVM starts, which the suite's shared session does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_delta_commit import expected, run_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def _delta_jars() -> list[str]:
    env = os.environ.get("PIDFENCE_DELTA_JARS")
    if env:
        where = Path(env)
    else:
        from pidfence.services.jars import cache_dir

        where = cache_dir() / "delta"
    jars = sorted(
        str(p)
        for p in where.glob("delta-*.jar")
        if p.name.startswith(("delta-spark_", "delta-storage-"))
    )
    return jars if len(jars) == 2 else []


#: A child's Spark session with Delta's extension and catalog (``path``, ``jars`` from argv).
SESSION = """
import json, sys
from pyspark.sql import SparkSession

path, jars = sys.argv[1], sys.argv[2]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.jars", jars)
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate()
)
"""
CHILD = (
    SESSION
    + """
try:
    df = spark.read.format("delta").load(path)
    rows = [
        [r.topic, r.partition, r.log_offset, r.value.decode(), r.offset]
        for r in df.orderBy("topic", "partition", "log_offset").collect()
    ]
    print(json.dumps({"schema": df.schema.simpleString(), "rows": rows}))
finally:
    spark.stop()
"""
)


def spark_reads_delta(path: str, jars: list[str]) -> dict[str, Any]:
    """``spark.read.format("delta").load(path)`` in a child Spark with the delta jars: its
    schema and ``[topic, partition, log_offset, value, offset]`` rows in log order."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, path, ",".join(jars)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_spark_reads_exactly_the_committed_rows(tmp_path: Path) -> None:
    jars = _delta_jars()
    if not jars:
        pytest.skip(
            "delta-spark jars not in the jar cache (add the infra/jvm delta module and run "
            "make setup, or set PIDFENCE_DELTA_JARS)"
        )
    from pidfence.spark_sink.delta.care import compact

    path = str(tmp_path)
    for b in range(3):
        run_batch(path, b)
    compact(path)
    run_batch(path, 3)

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        raise Crash(point)

    with pytest.raises(Crash):
        run_batch(path, 4, hook=crash)  # moved into data/, never committed: Spark must not see it

    out = spark_reads_delta(path, jars)
    assert out["schema"] == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>,"
        "pid:bigint,generation:bigint,seq:bigint,log_offset:bigint>"
    )
    want = expected([0, 1, 2, 3])
    assert out["rows"] == [
        [r["topic"], r["partition"], r["log_offset"], r["value"].decode(), r["offset"]]
        for r in want.to_pylist()
    ]
