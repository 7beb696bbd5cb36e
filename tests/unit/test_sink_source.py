"""The ``pidfence`` data source as Spark calls it (no Spark session): options arrive in Spark's
case-insensitive dictionary, which keeps its keys in lower case."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import BinaryType, StructField, StructType

from pidfence.pid_allocator import LeaseServerThread, MemoryCoordinator
from pidfence.services.ports import free_port
from pidfence.spark_sink.delta.errors import TableGone
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.query_owner import owner_of
from pidfence.spark_sink.schema import KAFKA_COLUMNS, LOG_DDL, REJECTS_DDL
from pidfence.spark_sink.source import PidfenceDataSource

QUERY = "0f1e2d3c-source-query"
#: What the Kafka source gives the sink (only the names are checked).
KAFKA_INPUT = StructType([StructField(name, BinaryType()) for name in KAFKA_COLUMNS])


def _source(**options: str) -> PidfenceDataSource:
    return PidfenceDataSource(CaseInsensitiveDict(options))


def _checkpoint(folder: Path, committed: bool) -> str:
    """A checkpoint of the query ``QUERY``, with a committed batch or none yet."""
    folder.mkdir()
    (folder / "metadata").write_text(f'{{"id":"{QUERY}"}}\n')
    if committed:
        (folder / "commits").mkdir()
        (folder / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(folder)


def test_the_writer_claims_the_path_for_the_checkpoints_query(tmp_path: Path) -> None:
    out = tmp_path / "out"
    checkpoint = _checkpoint(tmp_path / "ckpt", committed=False)
    source = _source(path=str(out), checkpointLocation=checkpoint)
    writer = source.streamWriter(KAFKA_INPUT, overwrite=False)
    assert writer.query_id == QUERY
    assert owner_of(Output.reading(str(out)).own) == QUERY


def test_a_checkpoint_that_committed_batches_refuses_an_output_that_is_gone(
    tmp_path: Path,
) -> None:
    checkpoint = _checkpoint(tmp_path / "ckpt", committed=True)
    source = _source(path=str(tmp_path / "out"), checkpointLocation=checkpoint)
    with pytest.raises(TableGone):
        source.streamWriter(KAFKA_INPUT, overwrite=False)


@pytest.mark.parametrize(("table", "ddl"), [("log", LOG_DDL), ("rejects", REJECTS_DDL)])
def test_the_reader_schema_is_the_tables(tmp_path: Path, table: str, ddl: str) -> None:
    assert _source(path=str(tmp_path), table=table).schema() == ddl


@pytest.fixture
def lease_server() -> Iterator[LeaseServerThread]:
    """A lease server on the in-memory coordinator whose leases last a day (its default)."""
    with LeaseServerThread(None, coordinator=MemoryCoordinator()) as running:
        yield running


def test_a_lifetime_shorter_than_the_lease_servers_is_refused_at_start(
    tmp_path: Path, lease_server: LeaseServerThread
) -> None:
    """The sink would forget producers whose lease is live (the lease servers' 1d default)."""
    source = _source(path=str(tmp_path / "out"), leaseServer=lease_server.address, lifetime="1h")
    with pytest.raises(SinkOptionError, match=r"lifetime=1h is shorter .* lifetime \(1d\)"):
        source.streamWriter(KAFKA_INPUT, overwrite=False)
    assert not (tmp_path / "out").exists()  # refused before it claimed or wrote anything
    longer = _source(path=str(tmp_path / "out"), leaseServer=lease_server.address, lifetime="2d")
    assert longer.streamWriter(KAFKA_INPUT, overwrite=False).options.lifetime_ms == 2 * 86_400_000


def test_lease_servers_that_do_not_answer_do_not_stop_a_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _source(
        path=str(tmp_path / "out"), leaseServer=f"127.0.0.1:{free_port()}", lifetime="1h"
    )
    with caplog.at_level(logging.WARNING):
        source.streamWriter(KAFKA_INPUT, overwrite=False)
    assert "did not say their lease lifetime" in caplog.text


def test_token_files_only_the_executors_read_do_not_stop_a_start(
    tmp_path: Path, lease_server: LeaseServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver never read ``leaseTokenFile`` before the check (docs: every executor reads
    it): a path only executors have is not a reason to refuse a start."""
    source = _source(
        path=str(tmp_path / "out"),
        leaseServer=lease_server.address,
        leaseTokenFile="only-on-executors.token",
        lifetime="1h",
    )
    with caplog.at_level(logging.WARNING):
        source.streamWriter(KAFKA_INPUT, overwrite=False)
    assert "lifetime was not checked" in caplog.text
