"""Issue 43: a user's own query without ``startingOffsets`` over a topic that already holds
records appends them all or fails naming ``startingOffsets``; it never ends well with records
skipped (Spark's Kafka source starts a new query at ``latest``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pidfence.cli.exits import EXIT_UNAVAILABLE, code_of
from pidfence.spark_sink import read_log, register
from pidfence.spark_sink.failure import failure_of
from pidfence.spark_sink.first_batch import StartSkipsRecords
from tests.integration.conftest import produce_labelled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def users_query(
    spark: Any, bootstrap: str, topic: str, tmp: Path, source: dict[str, str], sink: dict[str, str]
) -> None:
    """A query as a user writes it (docs/sink.md), run to the end of the topic."""
    register(spark)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
    )
    for key, value in source.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.format("pidfence")
        .option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "ckpt"))
    )
    for key, value in sink.items():
        writer = writer.option(key, value)
    writer.trigger(availableNow=True).start().awaitTermination()


def test_a_users_query_without_starting_offsets_fails_naming_it(
    spark: Any, kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce_labelled(kafka.bootstrap, topic, [(f"e{i}", None, 0) for i in range(100)])
    for _ in range(2):  # the same checkpoint again: the same refusal, never a silent start
        with pytest.raises(Exception) as failed:
            users_query(spark, kafka.bootstrap, topic, tmp_path, {}, {})
        error = failure_of(failed.value)
        assert isinstance(error, StartSkipsRecords), failed.value
        assert "startingOffsets" in str(error) and "100 records" in str(error)
        assert f"{topic}[0] offsets 0..99" in str(error)
        assert code_of(error) == EXIT_UNAVAILABLE
        assert read_log(str(tmp_path / "out")).num_rows == 0


def test_with_earliest_on_source_and_sink_it_appends_them_all(
    spark: Any, kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce_labelled(kafka.bootstrap, topic, [(f"e{i}", None, 0) for i in range(100)])
    earliest = {"startingOffsets": "earliest"}
    users_query(spark, kafka.bootstrap, topic, tmp_path, earliest, earliest)
    log = read_log(str(tmp_path / "out"))
    assert [v.decode() for v in log.column("value").to_pylist()] == [f"e{i}" for i in range(100)]


def test_latest_asked_for_on_the_sink_starts_there(
    spark: Any, kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce_labelled(kafka.bootstrap, topic, [(f"e{i}", None, 0) for i in range(100)])
    users_query(spark, kafka.bootstrap, topic, tmp_path, {}, {"startingOffsets": "latest"})
    assert read_log(str(tmp_path / "out")).num_rows == 0
