"""The simulated sink's output as the checker reads the real one: the log, the rejects and the
gap reports as pyarrow tables with the real tables' columns (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pidfence.sim.kafka import KafkaRecord
from pidfence.spark_sink.schema import PLACE_FIELDS, WRITER_FIELDS
from pidfence.verify import REJECT_COLUMNS
from pidfence.wire import MalformedHeader, Verdict, decode_pf


def gaps_table(topic: str, gaps: Sequence[tuple[Any, ...]]) -> pa.Table:
    """The gaps reported, as ``pidfence.spark_sink.read_gaps`` lists them (the seq gaps'
    columns; ``offsets`` gaps carry no pid)."""
    rows = [g for g in gaps if g[1] != "offsets"]
    return pa.table(
        {
            "topic": [topic] * len(rows),
            "partition": [g[0] for g in rows],
            "kind": [g[1] for g in rows],
            "pid": [g[2] for g in rows],
            "generation": [g[3] for g in rows],
            "seq_first": [g[4] for g in rows],
            "seq_last": [g[5] for g in rows],
        },
        schema=pa.schema(
            [("topic", pa.string()), ("partition", pa.int32()), ("kind", pa.string())]
            + [(c, pa.int64()) for c in ("pid", "generation", "seq_first", "seq_last")]
        ),
    )


def output_table(
    topic: str, parts: Sequence[Sequence[tuple[KafkaRecord, Verdict]]], verdicts: bool
) -> pa.Table:
    """One table of the output: each partition's records in log order (the log), or the
    rejects with their verdicts (``verdicts``)."""
    cols: dict[str, list[object]] = {k: [] for k in REJECT_COLUMNS}
    for p, rows in enumerate(parts):
        for i, (rec, verdict) in enumerate(rows):
            pid = gen = seq = 0
            if rec.header is not None:
                try:
                    pf = decode_pf(rec.header)
                    pid, gen, seq = pf.pid, pf.generation, pf.seq
                except MalformedHeader:
                    pass
            for k, v in (
                ("topic", topic),
                ("partition", p),
                ("log_offset", i),
                ("pid", pid),
                ("generation", gen),
                ("seq", seq),
                ("key", rec.key),
                ("value", rec.value),
                ("offset", rec.offset),
                ("timestamp", rec.ts_ms),
                ("verdict", verdict.value),
            ):
                cols[k].append(v)
    if not verdicts:
        del cols["verdict"]
    return pa.table(cols, schema=_schema(verdicts))


def _schema(verdicts: bool) -> pa.Schema:
    """The real tables' columns, but a timestamp in epoch milliseconds (the simulation's)."""
    bytes_and_place = [("key", pa.binary()), ("value", pa.binary()), ("offset", pa.int64())]
    fields = [*PLACE_FIELDS, ("log_offset", pa.int64()), *WRITER_FIELDS, *bytes_and_place]
    fields += [("timestamp", pa.int64()), *([("verdict", pa.string())] if verdicts else [])]
    return pa.schema(fields)


__all__ = ["gaps_table", "output_table"]
