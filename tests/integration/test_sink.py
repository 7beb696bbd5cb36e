"""The pidfence sink on real Kafka and Spark: a crafted raw topic becomes exactly the expected log.

The raw topic is produced directly with hand-built ``pf`` headers, so every case of DESIGN §4 is
present on purpose: duplicates, zombie writes after a FENCE, an unknown pid, a malformed header, a
record without a header, records reordered within the window, a generation bump, an invalid
generation, and a record held across runs. The output log and the rejects log must equal the
expected rows exactly, run after run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.manifest import part_name
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.state_files import STATE
from pidfence.spark_sink.storage import Store
from pidfence.wire import FLAG_FENCE, encode_pf

if TYPE_CHECKING:
    from tests.integration.conftest import SinkOver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MALFORMED = b"\x95\x01\xc1junk"


@dataclass(frozen=True)
class Rec:
    """One crafted raw record: ``header`` is (pid, generation, seq[, flags]), None or bytes."""

    label: str
    partition: int
    header: tuple[int, ...] | bytes | None

    def pf(self) -> bytes | None:
        """The ``pf`` header value."""
        if self.header is None or isinstance(self.header, bytes):
            return self.header
        return encode_pf(*self.header)

    def identity(self) -> tuple[int, int, int]:
        """(pid, generation, seq) as the log stores them (zeros without a valid header)."""
        if self.header is None or isinstance(self.header, bytes):
            return (0, 0, 0)
        return self.header[0], self.header[1], self.header[2]


F = FLAG_FENCE

#: Run 1. Partition 0 holds every rule case; partition 1 has its own, independent state.
RUN1 = [
    Rec("a0", 0, (1, 10, 0)),
    Rec("a1", 0, (1, 10, 1)),
    Rec("a1-dup", 0, (1, 10, 1)),
    Rec("plain", 0, None),
    Rec("a-fence", 0, (1, 11, 2, F)),
    Rec("a2-zombie", 0, (1, 10, 2)),
    Rec("a2", 0, (1, 11, 2)),
    Rec("b3-unknown", 0, (2, 0, 3)),
    Rec("bad", 0, MALFORMED),
    Rec("c0", 0, (3, 5, 0)),
    Rec("c2-early", 0, (3, 5, 2)),
    Rec("c1", 0, (3, 5, 1)),
    Rec("c3-invalid-gen", 0, (3, 7, 3)),
    Rec("c3-bumped", 0, (3, 6, 3)),
    Rec("c4-zombie", 0, (3, 5, 4)),
    Rec("c9-too-far", 0, (3, 6, 10)),
    Rec("p1-a0", 1, (1, 10, 0)),
    Rec("p1-d0", 1, (4, 0, 0)),
    Rec("p1-d0-dup", 1, (4, 0, 0)),
    Rec("p1-plain", 1, (0, 0, 0)),
    Rec("p1-d1", 1, (4, 0, 1)),
]
LOG1 = {
    0: ["a0", "a1", "plain", "a2", "c0", "c1", "c2-early", "c3-bumped"],
    1: ["p1-a0", "p1-d0", "p1-plain", "p1-d1"],
}
REJECTS1 = {
    "a1-dup": "DUPLICATE",
    "a-fence": "FENCE",
    "a2-zombie": "FENCED",
    "b3-unknown": "UNKNOWN_PID",
    "bad": "MALFORMED",
    "c3-invalid-gen": "INVALID_GENERATION",
    "c4-zombie": "FENCED",
    "c9-too-far": "OUT_OF_ORDER",
    "p1-d0-dup": "DUPLICATE",
}

#: Run 2: continues every producer; c6 waits for c5 past the end of the run.
RUN2 = [
    Rec("c4", 0, (3, 6, 4)),
    Rec("c3-dup", 0, (3, 6, 3)),
    Rec("a3", 0, (1, 11, 3)),
    Rec("c6-held", 0, (3, 6, 6)),
    Rec("p1-d2", 1, (4, 0, 2)),
    Rec("p1-d0-late-dup", 1, (4, 0, 0)),
]
LOG2 = {0: ["c4", "a3"], 1: ["p1-d2"]}
REJECTS2 = {"c3-dup": "DUPLICATE", "p1-d0-late-dup": "DUPLICATE"}

#: Run 3: c5 arrives and releases c6, held by the previous run.
RUN3 = [Rec("c5", 0, (3, 6, 5)), Rec("a4", 0, (1, 11, 4))]
LOG3 = {0: ["c5", "c6-held", "a4"], 1: []}
REJECTS3: dict[str, str] = {}


@dataclass
class Sent:
    """Where each label landed in Kafka."""

    offset: dict[str, int]
    ts_ms: dict[str, int]
    recs: dict[str, Rec]


def produce(bootstrap: str, topic: str, recs: Sequence[Rec], sent: Sent | None = None) -> Sent:
    """Produce ``recs`` in order (one in-flight request, so offsets follow the list)."""
    sent = sent or Sent({}, {}, {})
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    base = int(time.time() * 1000)
    for i, rec in enumerate(recs):
        pf = rec.pf()
        ts = base + i
        sent.ts_ms[rec.label] = ts
        sent.recs[rec.label] = rec

        def on_delivery(err: Any, msg: Any, label: str = rec.label) -> None:
            assert err is None, err
            sent.offset[label] = msg.offset()

        producer.produce(
            topic,
            value=rec.label.encode(),
            key=None if rec.label.endswith("plain") else f"k-{rec.label}".encode(),
            partition=rec.partition,
            headers=None if pf is None else [("other", b"x"), ("pf", pf)],
            timestamp=ts,
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0
    return sent


def expected_log(
    topic: str, sent: Sent, logs: Sequence[dict[int, list[str]]]
) -> list[dict[str, Any]]:
    """Output log rows of runs ``logs`` (log offsets continue across runs)."""
    rows = []
    for partition in sorted({p for log in logs for p in log}):
        labels = [label for log in logs for label in log.get(partition, [])]
        for log_offset, label in enumerate(labels):
            rows.append(_row(topic, sent, label, log_offset))
    return rows


def expected_rejects(topic: str, sent: Sent, rejects: dict[str, str]) -> list[dict[str, Any]]:
    """Rejects rows, in (partition, offset) order."""
    rows = [_row(topic, sent, label, None) | {"verdict": v} for label, v in rejects.items()]
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _row(topic: str, sent: Sent, label: str, log_offset: int | None) -> dict[str, Any]:
    rec = sent.recs[label]
    pid, generation, seq = rec.identity()
    pf = rec.pf()
    return {
        "key": None if label.endswith("plain") else f"k-{label}".encode(),
        "value": label.encode(),
        "topic": topic,
        "partition": rec.partition,
        "offset": sent.offset[label],
        "timestamp": datetime.fromtimestamp(sent.ts_ms[label] / 1000, UTC),
        "timestampType": 0,  # CreateTime: the producer set it
        "headers": None
        if pf is None
        else [
            {"key": "other", "value": b"x"},
            {"key": "pf", "value": pf},
        ],  # every record's own headers, as Kafka's source gives them
        "pid": pid,
        "generation": generation,
        "seq": seq,
        "log_offset": log_offset,
    }


def labels(table: pa.Table) -> list[str]:
    """The values (labels) of a log or rejects table, in its order."""
    return [v.decode() for v in table.column("value").to_pylist()]


def assert_output(
    output: Path,
    topic: str,
    sent: Sent,
    logs: Sequence[dict[int, list[str]]],
    rejects: dict[str, str],
) -> None:
    """The committed log and rejects equal the expected rows exactly."""
    log = read_log(str(output))
    assert labels(log) == [r["value"].decode() for r in expected_log(topic, sent, logs)]
    assert log.to_pylist() == expected_log(topic, sent, logs)
    rej = read_rejects(str(output))
    assert dict(zip(labels(rej), rej.column("verdict").to_pylist(), strict=True)) == rejects
    assert rej.to_pylist() == expected_rejects(topic, sent, rejects)
    if (output / "_delta_log").is_dir():
        assert_delta_alone(
            output, expected_log(topic, sent, logs), expected_rejects(topic, sent, rejects)
        )


def assert_delta_alone(
    output: Path, log: list[dict[str, Any]], rejects: list[dict[str, Any]]
) -> None:
    """``deltalake`` alone (and Polars, and pyarrow through deltalake's dataset) read exactly the
    expected rows from the Delta tables: no pidfence code in the read path."""
    import polars as pl
    from deltalake import DeltaTable

    order = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    got = DeltaTable(str(output)).to_pyarrow_table().sort_by(order)
    assert got.to_pylist() == log
    dataset = DeltaTable(str(output)).to_pyarrow_dataset().to_table().sort_by(order)
    assert dataset.to_pylist() == log
    frame = pl.read_delta(str(output)).sort(["topic", "partition", "log_offset"])
    assert frame["value"].to_list() == [r["value"] for r in log]
    assert frame["offset"].to_list() == [r["offset"] for r in log]
    names = [*log[0].keys(), "verdict"] if log else None
    rej = DeltaTable(str(output / "_rejects")).to_pyarrow_table(columns=names)
    rej = rej.sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert rej.to_pylist() == rejects


def own_root(output: Path) -> Path:
    """Where the sink keeps its own files (state, manifests, owner): ``_pidfence/``."""
    return output / OWN_DIR


def state_file_names(output: Path, topic: str, partition: int) -> list[str]:
    """The partition's state files, oldest first."""
    store = Store.at(str(own_root(output)))
    return store.list(store.join(STATE, part_name(topic, partition)))


@pytest.fixture
def run1(sink_over: Callable[..., SinkOver]) -> tuple[SinkOver, Any]:
    """RUN1 sent and sunk once, under the proposal's rules as DESIGN §4 states them (the sink
    resolves gaps by default): the sink and that run's summary."""
    sink = sink_over(resolveGaps="false")
    sink.send(RUN1)
    return sink, sink.run()


def test_crafted_topic_becomes_the_expected_log_run_after_run(
    run1: tuple[SinkOver, Any], spark: Any
) -> None:
    sink, summary = run1
    out, topic, sent = sink.out, sink.topic, sink.sent
    assert summary.records_in == len(RUN1)
    assert summary.appended == sum(len(v) for v in LOG1.values())
    assert_output(out, topic, sent, [LOG1], REJECTS1)

    sink.send(RUN2)
    summary = sink.run()
    assert summary.records_in == len(RUN2)
    # c6 is neither appended nor rejected yet: it waits for c5 in the partition's state.
    assert_output(out, topic, sent, [LOG1, LOG2], REJECTS1 | REJECTS2)

    sink.send(RUN3)
    sink.run()
    assert_output(out, topic, sent, [LOG1, LOG2, LOG3], REJECTS1 | REJECTS2 | REJECTS3)

    # Nothing new in the topic: a run commits nothing and changes nothing.
    sink.run()
    assert_output(out, topic, sent, [LOG1, LOG2, LOG3], REJECTS1 | REJECTS2 | REJECTS3)

    # Spark's reader returns the same committed rows.
    expected = expected_log(topic, sent, [LOG1, LOG2, LOG3])
    got = spark.read.format("pidfence").load(str(out)).orderBy("partition", "log_offset").collect()
    no_ts = [{k: v for k, v in r.items() if k != "timestamp"} for r in expected]
    assert [
        {k: _plain(v) for k, v in r.asDict(recursive=True).items() if k != "timestamp"} for r in got
    ] == no_ts
    assert [r["timestamp"].timestamp() for r in got] == [
        r["timestamp"].timestamp() for r in expected
    ]
    rejected = spark.read.format("pidfence").option("table", "rejects").load(str(out))
    assert sorted(r["verdict"] for r in rejected.collect()) == sorted(
        (REJECTS1 | REJECTS2 | REJECTS3).values()
    )
    _spark_delta_reads(spark, out, expected)


def test_partitions_coalesced_into_fewer_tasks_are_each_judged_whole_and_alone(
    sink_over: Callable[..., SinkOver],
) -> None:
    """``build_query`` coalesces the topic's partitions into as many tasks as Spark has cores
    (two here, for six partitions): a task then writes several partitions, each one whole and
    judged on its own state, and the output is the same as with a task per partition."""
    sink = sink_over(partitions=6, resolveGaps="false")
    copies = range(3)  # RUN1's two partitions, again in partitions 2-3 and 4-5

    def moved(rec: Rec, k: int) -> Rec:
        return Rec(f"{k}{rec.label}", rec.partition + 2 * k, rec.header)

    sink.send([moved(rec, k) for rec in RUN1 for k in copies])
    summary = sink.run()
    assert summary.records_in == 3 * len(RUN1)
    logs = {p + 2 * k: [f"{k}{label}" for label in LOG1[p]] for p in LOG1 for k in copies}
    rejects = {f"{k}{label}": v for label, v in REJECTS1.items() for k in copies}
    assert_output(sink.out, sink.topic, sink.sent, [logs], rejects)
    # Parts one task wrote share its attempt tag: six partitions, at most two tasks.
    (manifest,) = Output.reading(str(sink.out)).manifests(-1)
    assert len(manifest.parts) == 6
    assert len({part.tag for part in manifest.parts}) <= 2


def _plain(value: Any) -> Any:
    """A Spark row value as pyarrow gives it (bytes, not bytearray; nested too)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _spark_delta_reads(spark: Any, out: Path, expected: list[dict[str, Any]]) -> None:
    """With Spark's Delta in the session, its reader returns exactly the expected rows."""
    from tests.fixtures.delta_spark import has_delta
    from tests.integration.test_delta_spark import spark_reads_delta

    if not has_delta(spark):
        return  # test_delta_spark reports the missing jars (skipped there)
    rows = spark_reads_delta(spark, str(out))["rows"]
    assert rows == [
        [r["topic"], r["partition"], r["log_offset"], r["value"].decode(), r["offset"]]
        for r in expected
    ]


def test_lost_or_corrupt_newest_state_is_rebuilt_from_older_state_and_the_log(
    run1: tuple[SinkOver, Any], tmp_path: Path
) -> None:
    sink, _ = run1
    out, topic, sent = sink.out, sink.topic, sink.sent
    # RUN2 without the held record: no payload waits in the state we are about to damage.
    sink.send([r for r in RUN2 if r.label != "c6-held"])
    sink.run()

    store = Store.at(str(own_root(out)))
    p0 = state_file_names(out, topic, 0)
    p1 = state_file_names(out, topic, 1)
    assert len(p0) == 2 and len(p1) == 2, (p0, p1)
    # Partition 0: the newest snapshot is corrupt; partition 1: it is gone.
    newest0 = store.join(STATE, part_name(topic, 0), p0[-1])
    data = bytearray(store.read(newest0))
    data[-3] ^= 0xFF
    store.put(newest0, bytes(data))
    store.delete(store.join(STATE, part_name(topic, 1), p1[-1]))

    run3 = [
        Rec("c5", 0, (3, 6, 5)),
        Rec("c4-dup", 0, (3, 6, 4)),
        Rec("a3-dup", 0, (1, 11, 3)),
        Rec("a2-zombie-2", 0, (1, 10, 4)),
        Rec("a4", 0, (1, 11, 4)),
        Rec("p1-d2-dup", 1, (4, 0, 2)),
        Rec("p1-d3", 1, (4, 0, 3)),
    ]
    sink.send(run3)
    sink.run()
    log3 = {0: ["c5", "a4"], 1: ["p1-d3"]}
    rejects = (
        REJECTS1
        | REJECTS2
        | {
            "c4-dup": "DUPLICATE",
            "a3-dup": "DUPLICATE",
            "a2-zombie-2": "FENCED",
            "p1-d2-dup": "DUPLICATE",
        }
    )
    assert_output(out, topic, sent, [LOG1, LOG2, log3], rejects)

    # A sink over the same topic from scratch (one batch, no damage) writes the same rows.
    ref_out = tmp_path / "ref"
    sink.run(ref_out)
    assert read_log(str(ref_out)) == read_log(str(out))
    assert read_rejects(str(ref_out)) == read_rejects(str(out))
