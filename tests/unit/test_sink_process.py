"""The sink's per-partition step equals the per-record rules, however the stream is batched."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from pidfence.broker_plugin import ProducerStateTable
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.partition_batch import pf_headers, process_partition
from pidfence.spark_sink.schema import KAFKA_COLUMNS
from pidfence.spark_sink.state import PartitionState
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from pidfence.wire import FLAG_FENCE, encode_pf

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
Record = tuple[int, bytes | None, int]  # (kafka offset, pf header or None, ts_ms)


def make_stream(seed: int, n: int = 400) -> list[Record]:
    """Duplicates, reordering, fences with zombies, unknown pids, malformed and missing headers."""
    rng = random.Random(seed)
    gens = {pid: 0 for pid in range(1, 6)}
    seqs = {pid: 0 for pid in gens}
    out: list[Record] = []
    pending: list[bytes | None] = []
    ts = 1_000
    while len(out) + len(pending) < n:
        pid = rng.choice(list(gens))
        roll = rng.random()
        header: bytes | None
        if roll < 0.05:
            header = None
        elif roll < 0.08:
            header = b"\x07garbage"
        elif roll < 0.11:
            header = encode_pf(900 + rng.randrange(5), 0, 3 + rng.randrange(3))  # unknown pid
        elif roll < 0.14:
            gens[pid] += 1
            header = encode_pf(pid, gens[pid], seqs[pid], FLAG_FENCE)
        elif roll < 0.18 and gens[pid] > 0:
            header = encode_pf(pid, gens[pid] - 1, seqs[pid])  # zombie
        elif roll < 0.28 and seqs[pid] > 0:
            header = encode_pf(pid, gens[pid], rng.randrange(seqs[pid]))  # duplicate
        else:
            header = encode_pf(pid, gens[pid], seqs[pid])
            seqs[pid] += 1
        pending.append(header)
        if len(pending) >= 3 or rng.random() < 0.5:
            if rng.random() < 0.2:
                pending.reverse()  # a small reorder
            for h in pending:
                out.append((len(out), h, ts))
                ts += rng.randrange(3)
            pending = []
    for h in pending:
        out.append((len(out), h, ts))
    return out


def kafka_rows(records: list[Record], topic: str = "t", partition: int = 0) -> pa.Table:
    """Rows shaped like Spark's Kafka source (as the Arrow writer receives them)."""
    return pa.table(
        {
            "key": pa.array([b"k%d" % o for o, _, _ in records], pa.binary()),
            "value": pa.array([b"v%d" % o for o, _, _ in records], pa.binary()),
            "topic": pa.array([topic] * len(records), pa.string()),
            "partition": pa.array([partition] * len(records), pa.int32()),
            "offset": pa.array([o for o, _, _ in records], pa.int64()),
            "timestamp": pa.array([t * 1000 for _, _, t in records], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "timestampType": pa.array([o % 2 for o, _, _ in records], pa.int32()),
            "headers": pa.array([record_headers(o, h) for o, h, _ in records], HEADERS_TYPE),
        }
    )


def write_as_task(
    monkeypatch: pytest.MonkeyPatch,
    writer: PidfenceStreamWriter,
    batch: int,
    records: list[Record],
    attempt: int = 0,
    *,
    query: str,
) -> SinkCommitMessage:
    """``writer.write()`` of ``records`` (chunks of 17 rows) as Spark's task of this batch."""
    monkeypatch.setattr(writer_mod, "_task_context", lambda: (batch, attempt, query))
    return writer.write(iter(kafka_rows(records).to_batches(max_chunksize=17)))


def commit_batches(
    monkeypatch: pytest.MonkeyPatch,
    writer: PidfenceStreamWriter,
    chunks: list[list[Record]],
    start: int = 0,
    *,
    query: str,
) -> None:
    """Write and commit each chunk as one micro-batch, numbered from ``start``."""
    for b, chunk in enumerate(chunks, start=start):
        writer.commit([write_as_task(monkeypatch, writer, b, chunk, query=query)], b)


def micro_batches(records: list[Record], size: int) -> list[list[Record]]:
    """``records`` cut into micro-batches of ``size``."""
    return [records[i : i + size] for i in range(0, len(records), size)]


def record_headers(offset: int, pf: bytes | None) -> list[dict[str, Any]]:
    """A record's own headers: an application header, and the ``pf`` header when it has one."""
    own = [{"key": "trace", "value": b"t%d" % offset}]
    return [*own, {"key": "pf", "value": pf}] if pf is not None else own


def expected_log(records: list[Record]) -> list[int]:
    """The offsets :func:`reference` appends with the table the sink tests' writers use
    (capacity 64, lifetime 10,000 s, reorder window 3)."""
    return reference(records, capacity=64, lifetime_ms=10_000_000, reorder_window=3)[0]


def reference(records: list[Record], **kwargs: Any) -> tuple[list[int], dict[int, str]]:
    """Per-record rules: appended Kafka offsets in log order, and dropped offset → verdict.

    Gap resolution is on unless ``resolve_gaps=False`` is passed, as in the sink.
    """
    kwargs.setdefault("resolve_gaps", True)
    table = ProducerStateTable(**kwargs)
    log: list[int] = []
    dropped: dict[int, str] = {}
    for offset, header, ts in records:
        for d in table.offer_header(header, ts, ref=offset):
            if d.verdict.appended:
                log.append(d.ref)
            elif d.verdict.final:
                dropped[d.ref] = d.verdict.name
    return log, dropped


SETTINGS = {"capacity": 64, "lifetime_ms": 10_000_000, "reorder_window": 3}


@pytest.mark.parametrize("seed", range(6))
def test_batches_equal_per_record_rules(seed: int) -> None:
    records = make_stream(seed)
    rng = random.Random(seed)
    st = PartitionState(ProducerStateTable(**SETTINGS, resolve_gaps=True))
    logs, rejects = [], []
    i = 0
    while i < len(records):
        step = rng.randrange(1, 60)
        chunk = records[i : i + step]
        rng.shuffle(chunk)  # the writer sorts by Kafka offset itself
        out = process_partition(kafka_rows(chunk), "t", 0, st)
        logs.append(out.log)
        rejects.append(out.rejects)
        i += step
    log = pa.concat_tables(logs)
    expected_log, expected_dropped = reference(records, **SETTINGS)
    assert log.column("offset").to_pylist() == expected_log
    assert log.column("log_offset").to_pylist() == list(range(len(expected_log)))
    rej = pa.concat_tables(rejects)
    got = dict(zip(rej["offset"].to_pylist(), rej["verdict"].to_pylist(), strict=True))
    assert got == expected_dropped
    assert set(st.held) | set(expected_log) | set(got) == {o for o, _, _ in records}


def test_log_rows_carry_payload_and_decoded_header() -> None:
    records: list[Record] = [(0, encode_pf(7, 2, 0), 5), (1, None, 6), (2, encode_pf(7, 2, 1), 7)]
    out = process_partition(
        kafka_rows(records, "orders", 3), "orders", 3, PartitionState(ProducerStateTable(8, 1000))
    )
    rows = out.log.to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert rows[0]["pid"] == 7 and rows[0]["generation"] == 2 and rows[2]["seq"] == 1
    assert rows[1]["pid"] == 0  # no header: appended as NON_IDEMPOTENT
    assert rows[0]["topic"] == "orders" and rows[0]["partition"] == 3
    assert rows[2]["value"] == b"v2" and rows[2]["key"] == b"k2"
    assert out.counts == {"APPENDED": 2, "NON_IDEMPOTENT": 1}


def test_pf_header_is_the_first_pf_among_others() -> None:
    headers = pa.array(
        [
            [{"key": "trace", "value": b"x"}, {"key": "pf", "value": b"A"}],
            [],
            [{"key": "pf", "value": b"B"}, {"key": "pf", "value": b"C"}],
            None,
        ],
        HEADERS_TYPE,
    )
    assert pf_headers(headers).to_pylist() == [b"A", None, b"B", None]


def test_flush_held_decides_waiting_records_at_batch_end() -> None:
    records: list[Record] = [(0, encode_pf(7, 0, 0), 1), (1, encode_pf(7, 0, 2), 2)]
    st = PartitionState(ProducerStateTable(8, 1000, reorder_window=3))
    out = process_partition(kafka_rows(records), "t", 0, st, flush_held=True)
    assert out.rejects.column("verdict").to_pylist() == ["OUT_OF_ORDER"]
    assert not st.held


def test_a_pf_header_with_a_null_value_is_malformed_not_opt_out() -> None:
    # Fix 5 of issue 11: a null-valued pf header was appended as NON_IDEMPOTENT.
    headers = pa.array(
        [[{"key": "pf", "value": None}], [], [{"key": "pf", "value": encode_pf(1, 0, 0)}]],
        HEADERS_TYPE,
    )
    assert pf_headers(headers).to_pylist() == [b"", None, encode_pf(1, 0, 0)]
    rows = kafka_rows([(0, None, 1), (1, None, 2), (2, encode_pf(1, 0, 0), 3)])
    rows = rows.set_column(rows.schema.get_field_index("headers"), "headers", headers)
    out = process_partition(rows, "t", 0, PartitionState(ProducerStateTable(8, 1000)))
    assert out.log.column("offset").to_pylist() == [1, 2]
    assert out.rejects.column("verdict").to_pylist() == ["MALFORMED"]
    assert out.counts == {"MALFORMED": 1, "NON_IDEMPOTENT": 1, "APPENDED": 1}


def test_held_records_are_part_of_the_batch_output() -> None:
    records: list[Record] = [(0, encode_pf(7, 0, 0), 1), (1, encode_pf(7, 0, 2), 2)]
    st = PartitionState(ProducerStateTable(8, 1000, reorder_window=3))
    out = process_partition(kafka_rows(records), "t", 0, st)
    assert out.held.column("offset").to_pylist() == [1]
    assert out.held.column("pf").to_pylist() == [encode_pf(7, 0, 2)]
    assert out.held.column("value").to_pylist() == [b"v1"]


def test_held_records_are_not_counted_until_decided() -> None:
    """A record waiting for its predecessor counts once, in the batch that decides it."""
    st = PartitionState(ProducerStateTable(8, 1000, reorder_window=3))
    waiting: list[Record] = [(0, encode_pf(7, 0, 0), 1), (1, encode_pf(7, 0, 2), 2)]
    first = process_partition(kafka_rows(waiting), "t", 0, st)
    assert first.held.num_rows == 1 and first.counts == {"APPENDED": 1}
    second = process_partition(kafka_rows([(2, encode_pf(7, 0, 1), 3)]), "t", 0, st)
    assert second.log.column("offset").to_pylist() == [2, 1]
    assert second.counts == {"APPENDED": 2}


def test_each_records_own_headers_and_timestamp_type_reach_the_log_and_the_rejects() -> None:
    # c2 waits for c1 across two batches: a held record keeps its headers too.
    records: list[Record] = [
        (0, encode_pf(7, 0, 0), 1),
        (1, encode_pf(7, 0, 2), 2),
        (2, encode_pf(7, 0, 0), 3),
    ]
    st = PartitionState(ProducerStateTable(8, 1000, reorder_window=3))
    first = process_partition(kafka_rows(records), "t", 0, st)
    assert first.rejects.column("verdict").to_pylist() == ["DUPLICATE"]
    assert first.rejects.column("headers").to_pylist() == [record_headers(2, records[2][1])]
    assert first.held.column("headers").to_pylist() == [record_headers(1, records[1][1])]
    second = process_partition(kafka_rows([(3, encode_pf(7, 0, 1), 4)]), "t", 0, st)
    log = pa.concat_tables([first.log, second.log])
    assert log.column("offset").to_pylist() == [0, 3, 1]
    assert log.column("headers").to_pylist() == [
        record_headers(o, h) for o, h, _ in [records[0], (3, encode_pf(7, 0, 1), 4), records[1]]
    ]
    assert log.column("timestampType").to_pylist() == [0, 1, 1]
    assert log.column_names[:8] == list(KAFKA_COLUMNS)  # the source's own, in its order
