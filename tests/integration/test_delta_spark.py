"""Spark reads the pidfence Delta table with ``delta-spark`` (``spark.read.format("delta")``).

The suite's shared session carries Spark's Delta when its jars are cached
(``tests/fixtures/delta_spark.py`` says which release and where the jars come from).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.delta_spark import MISSING, delta_jars, has_delta
from tests.unit.test_delta_commit import expected, run_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def spark_reads_delta(spark: Any, path: str) -> dict[str, Any]:
    """``spark.read.format("delta").load(path)``: its schema and
    ``[topic, partition, log_offset, value, offset]`` rows in log order."""
    df = spark.read.format("delta").load(path)
    rows = [
        [r.topic, r.partition, r.log_offset, bytes(r.value).decode(), r.offset]
        for r in df.orderBy("topic", "partition", "log_offset").collect()
    ]
    return {"schema": df.schema.simpleString(), "rows": rows}


def test_spark_reads_exactly_the_committed_rows(spark: Any, tmp_path: Path) -> None:
    if not delta_jars():
        pytest.skip(MISSING)
    assert has_delta(spark)
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

    out = spark_reads_delta(spark, path)
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
