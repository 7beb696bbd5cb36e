"""What each committed batch decided, record by record: the sink's own account of its commits.

Producer state is a function of what the sink committed (DESIGN §4 amended), not of whatever
rows a table holds later: another writer's appends must not move it, and rows a user deletes
(retention, GDPR) must stay deleted when their records are replayed upstream. So a batch also
commits, per (topic, partition), one small *decisions* file: every record the batch decided, by
identity only (Kafka offset, ``log_offset``, pid, generation, seq, timestamp, verdict and, for
rejects, the raw ``pf`` header): no key, no value, no headers. A state rebuild replays these
files; ``pidfence verify`` tells the sink's rows from others' and from rows deleted after commit
with them. The files live under ``_pidfence/``, invisible to Delta readers and ``VACUUM``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa

from pidfence.spark_sink.schema import TS_TYPE, WRITER_FIELDS
from pidfence.spark_sink.storage import DELTA_ENCODED
from pidfence.wire import Verdict, encode_pf

DECIDED_SCHEMA: Final = pa.schema(
    [
        ("offset", pa.int64()),
        ("log_offset", pa.int64()),
        *WRITER_FIELDS,
        ("timestamp", TS_TYPE),
        # Null for appended rows (the log's): only rejects need their verdict and raw header.
        ("verdict", pa.string()),
        ("pf", pa.binary()),
    ],
    # Integers only but for two mostly-null columns: written delta-encoded (storage.py).
    metadata={DELTA_ENCODED: b"1"},
)
_IDENTITY: Final = ("offset", "log_offset", "pid", "generation", "seq", "timestamp")
#: What a replay reads: every decided record with its header, time and final verdict.
REPLAY_SCHEMA: Final = pa.schema(
    [("offset", pa.int64()), ("pf", pa.binary()), ("ts_ms", pa.int64()), ("verdict", pa.string())]
)


def decided_rows(log: pa.Table | None, rejects: pa.Table | None) -> pa.Table:
    """A part's decisions from its log rows and its rejects (rejects carry ``verdict``, ``pf``).

    Args:
        log: the part's appended rows (the log schema), or None.
        rejects: the part's rejects with ``verdict`` and ``pf``, or None.
    """
    pieces = []
    if log is not None and log.num_rows:
        n = log.num_rows
        pieces.append(
            pa.Table.from_arrays(
                [log.column(c) for c in _IDENTITY]
                + [pa.nulls(n, pa.string()), pa.nulls(n, pa.binary())],
                schema=DECIDED_SCHEMA,
            )
        )
    if rejects is not None and rejects.num_rows:
        pieces.append(rejects.select(DECIDED_SCHEMA.names).cast(DECIDED_SCHEMA))
    if not pieces:
        return DECIDED_SCHEMA.empty_table()
    return pa.concat_tables(pieces).replace_schema_metadata(DECIDED_SCHEMA.metadata)


def replay_rows(table: pa.Table, verdict: str | None = None) -> pa.Table:
    """``(offset, pf, ts_ms, verdict)`` of decided rows, as a replay offers them to the rules.

    Appended rows get their ``pf`` header back from (pid, generation, seq) and the verdict
    ``APPENDED``; ``verdict`` overrides every row's (held records replay as ``BUFFERED``).

    Args:
        table: decisions (:data:`DECIDED_SCHEMA`) or held rows (which carry ``pf``).
        verdict: one verdict for every row, or None to use the rows' own.
    """
    n = table.num_rows
    pids = table.column("pid").to_pylist()
    gens = table.column("generation").to_pylist()
    seqs = table.column("seq").to_pylist()
    raw = table.column("pf").to_pylist() if "pf" in table.column_names else [None] * n
    if "verdict" in table.column_names:
        own = table.column("verdict").to_pylist()
        # A reject keeps its raw header (MALFORMED ones too); an appended row's is canonical.
        pf = [
            r if v is not None else (encode_pf(p, g, s) if p else None)
            for r, v, p, g, s in zip(raw, own, pids, gens, seqs, strict=True)
        ]
    else:  # held rows: their raw header
        own, pf = [None] * n, raw
    if verdict is not None:
        verdicts = [verdict] * n
    else:
        verdicts = [Verdict.APPENDED.value if v is None else v for v in own]
    ts_us = table.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    return pa.Table.from_arrays(
        [
            table.column("offset").cast(pa.int64()),
            pa.array(pf, pa.binary()),
            pa.array(np.asarray(ts_us) // 1000, pa.int64()),  # as the live run derived it
            pa.array(verdicts, pa.string()),
        ],
        schema=REPLAY_SCHEMA,
    )


def appended(table: pa.Table) -> pa.Table:
    """The decided rows that the log holds (no verdict)."""
    return table.filter(table.column("verdict").is_null())


__all__ = ["DECIDED_SCHEMA", "REPLAY_SCHEMA", "appended", "decided_rows", "replay_rows"]
