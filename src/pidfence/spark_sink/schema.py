"""The one documented schema of the output log and the rejects log (DESIGN §7, round 3).

The columns of Spark's Kafka source read with ``includeHeaders`` (same names, same types, same
order: ``key, value, topic, partition, offset, timestamp, timestampType, headers``; ``offset`` is
the Kafka offset), then pidfence's ``pid, generation, seq`` and ``log_offset`` (the output's own
dense offset per partition). The rejects add ``verdict``. A job moved from
``spark.readStream.format("kafka")`` to the output reads the same columns.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

TS_TYPE: Final = pa.timestamp("us", tz="UTC")
#: One Kafka header, as Spark's Kafka source gives it.
HEADER_TYPE: Final = pa.struct([("key", pa.string()), ("value", pa.binary())])
HEADERS_TYPE: Final = pa.list_(pa.field("element", HEADER_TYPE))

#: The columns of Spark's Kafka source (``includeHeaders=true``), in its order.
KAFKA_FIELDS: Final = (
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TS_TYPE),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", HEADERS_TYPE),
)
KAFKA_COLUMNS: Final = tuple(f.name for f in KAFKA_FIELDS)
#: pidfence's own columns, after the Kafka source's.
PIDFENCE_FIELDS: Final = (
    pa.field("pid", pa.int64()),
    pa.field("generation", pa.int64()),
    pa.field("seq", pa.int64()),
    pa.field("log_offset", pa.int64()),
)
LOG_SCHEMA: Final = pa.schema([*KAFKA_FIELDS, *PIDFENCE_FIELDS])
#: Where a record is (``topic``, ``partition``), for the other tables that name records.
PLACE_FIELDS: Final = KAFKA_FIELDS[2:4]
#: Who wrote a record and where in its sequence (``pid``, ``generation``, ``seq``).
WRITER_FIELDS: Final = PIDFENCE_FIELDS[:3]
REJECTS_SCHEMA: Final = LOG_SCHEMA.append(pa.field("verdict", pa.string()))
#: Records held for reordering at the end of a batch: the log columns plus the raw ``pf``.
HELD_SCHEMA: Final = LOG_SCHEMA.append(pa.field("pf", pa.binary()))

#: Spark DDL of the log, for ``spark.read.format("pidfence")``.
LOG_DDL: Final = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, pid BIGINT, "
    "generation BIGINT, seq BIGINT, log_offset BIGINT"
)
REJECTS_DDL: Final = LOG_DDL + ", verdict STRING"


def conform(table: pa.Table, schema: pa.Schema, *, keep_extra: bool = False) -> pa.Table:
    """``table`` as ``schema``: columns in its order and types, missing ones null.

    Args:
        table: the rows as read.
        schema: the schema to return.
        keep_extra: keep columns ``schema`` does not name (added by another writer) after its
            own, as they are.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    out = pa.Table.from_arrays(columns, schema=schema)
    if keep_extra:
        for name in table.column_names:
            if name not in schema.names:
                out = out.append_column(table.schema.field(name), table.column(name))
    return out


__all__ = [
    "HEADERS_TYPE",
    "HEADER_TYPE",
    "HELD_SCHEMA",
    "KAFKA_COLUMNS",
    "LOG_DDL",
    "LOG_SCHEMA",
    "REJECTS_DDL",
    "REJECTS_SCHEMA",
    "TS_TYPE",
    "conform",
]
