"""The ``pidfence`` data source: streaming writer, and a batch reader of the committed log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pidfence.spark_sink.authority import check_lifetime
from pidfence.spark_sink.delta.table import TableKind
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.schema import (
    KAFKA_COLUMNS,
    LOG_DDL,
    LOG_SCHEMA,
    REJECTS_DDL,
    REJECTS_SCHEMA,
    conform,
)
from pidfence.spark_sink.spark_checkpoint import checkpoint_query_id
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter

log = logging.getLogger(__name__)


class PidfenceDataSource(DataSource):
    """``format("pidfence")``: write a Kafka stream through the broker rules; read the log back.

    Reader option ``table``: ``log`` (default) or ``rejects``.
    """

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "pidfence"

    def _table(self) -> str:
        table = str(self.options.get("table", "log")).lower()
        if table not in ("log", "rejects"):
            raise SinkOptionError(f"option table={table!r}: use 'log' or 'rejects'")
        return table

    def schema(self) -> str:
        """The log's (or rejects') schema."""
        return REJECTS_DDL if self._table() == "rejects" else LOG_DDL

    def streamWriter(self, schema: StructType, overwrite: bool) -> PidfenceStreamWriter:
        """The writer; checks that the input is a Kafka source read with headers."""
        del overwrite
        missing = [c for c in KAFKA_COLUMNS if c not in schema.fieldNames()]
        if missing:
            raise SinkOptionError(
                f"the pidfence sink needs the Kafka source's columns; missing {missing}. Read "
                "with spark.readStream.format('kafka').option('includeHeaders', 'true') and do "
                "not drop columns"
            )
        parsed = SinkOptions.parse(dict(self.options))
        _check_lifetime(parsed)
        # Claims the path for this query (one query per path) before any batch runs.
        return PidfenceStreamWriter(parsed, checkpoint_query_id(parsed.checkpoint))

    def reader(self, schema: StructType) -> PidfenceReader:
        """A batch reader of the committed log."""
        del schema
        return PidfenceReader(SinkOptions.parse(dict(self.options)), self._table())


class FilePartition(InputPartition):
    """One committed Parquet file."""

    def __init__(self, root: str, path: str) -> None:
        super().__init__(path)
        self.root = root
        self.path = path


class PidfenceReader(DataSourceReader):
    """Reads committed files only; one Spark partition per file."""

    def __init__(self, options: SinkOptions, table: str) -> None:
        self.options = options
        self.table = table

    def _root(self) -> str:
        return self.options.rejects_path if self.table == "rejects" else self.options.path

    def partitions(self) -> list[FilePartition]:
        """The committed files of the log (or rejects): the files the Delta log adds."""
        from deltalake.exceptions import TableNotFoundError

        from pidfence.spark_sink.delta.table import open_table

        kind: TableKind = "rejects" if self.table == "rejects" else "log"
        root = self._root()
        try:
            dt = open_table(root, kind, create=False, reading=True)
        except TableNotFoundError:
            return []
        table = Store.at(root)
        # Paths relative to the table root (percent-decoded), as the Delta log adds them.
        return [FilePartition(root, table.join(unquote(a["path"]))) for a in _adds(dt)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        """Stream one file's record batches (the public columns only)."""
        schema = REJECTS_SCHEMA if self.table == "rejects" else LOG_SCHEMA
        table = conform(Store.at(partition.root).read_table(partition.path), schema)
        yield from table.to_batches()


def _adds(dt: Any) -> list[dict[str, Any]]:
    """The ``add`` actions of the table's current version."""
    actions: list[dict[str, Any]] = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    return [a for a in actions if a.get("path")]


def _check_lifetime(options: SinkOptions) -> None:
    """:func:`check_lifetime` at a query's start on the driver, when ``leaseServer`` is set.
    The token and TLS files need only be on the executors: where the driver cannot read them,
    the check is logged as not made rather than refusing the start."""
    try:
        client = options.lease_client()
    except SinkOptionError as exc:
        log.warning("the sink's lifetime was not checked against the lease servers': %s", exc)
        return
    if client is None:
        return
    try:
        check_lifetime(client, options.lifetime_ms)
    finally:
        client.close()
