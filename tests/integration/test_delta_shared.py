"""The output is a Delta table its users own (issue 23), driven as users drive it.

``pidfence sink`` runs in the background on a real Kafka topic while other engines do what a
table's owner does every day: delta-rs appends beside it, sets properties, adds a column,
compacts, vacuums with zero retention and deletes committed rows; Spark (delta-spark) sets a
property and deletes rows; upstream replays the deleted records. The sink carries on through all
of it; every acknowledged record lands exactly once (``pidfence verify``), deleted records do not
return, and each record's own headers are in the table, read by deltalake, Polars and Spark. A
RESTORE to before the sink's last batch then ends the run with exit 3 and one line naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field, PrimitiveType

from pidfence.cli.exits import EXIT_OK, EXIT_UNAVAILABLE
from pidfence.demo.procs import pidfence_argv, sink_args
from pidfence.ledger import LedgerEntry, LedgerWriter, value_digest
from pidfence.spark_sink import read_log, read_rejects, read_written
from pidfence.spark_sink.delta.history import BATCH_KEY
from pidfence.wire import encode_pf
from tests.fixtures.commands import stderr_lines
from tests.fixtures.delta_spark import has_delta

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

GEN = 4


class Upstream:
    """Sends records with a ``pf`` header and an application header, and ledgers each ack."""

    def __init__(self, bootstrap: str, topic: str, ledger: Path) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.ledger = LedgerWriter(ledger)
        self.headers: dict[tuple[int, int], list[tuple[str, bytes]]] = {}

    def send(self, pid: int, seqs: range, partition: int) -> None:
        """Produce (pid, seq) for each seq to ``partition``, in order; wait for every ack."""
        for seq in seqs:
            value = b"p%d-s%d" % (pid, seq)
            headers = [("app", b"h-%d-%d" % (pid, seq)), ("pf", encode_pf(pid, GEN, seq))]
            self.headers[(pid, seq)] = headers

            def acked(err: Any, msg: Any, seq: int = seq, value: bytes = value) -> None:
                assert err is None, err
                self.ledger.write(
                    LedgerEntry(
                        pid,
                        GEN,
                        self.topic,
                        msg.partition(),
                        seq,
                        value_digest(value),
                        msg.offset(),
                        msg.timestamp()[1],
                    )
                )

            self.producer.produce(
                self.topic,
                value=value,
                key=b"k%d" % pid,
                partition=partition,
                headers=headers,
                on_delivery=acked,
            )
        assert self.producer.flush(60) == 0
        self.ledger.flush()


class Sink:
    """``pidfence sink`` as a user starts it, in the background, as a session leader."""

    def __init__(self, bootstrap: str, topic: str, out: Path, ckpt: Path, logs: Path) -> None:
        self.stdout, self.stderr = logs / "sink.out", logs / "sink.err"
        argv = pidfence_argv(
            "sink",
            *sink_args(bootstrap, topic, out, ckpt),
            "--master",
            "local[2]",
            "--trigger",
            "1",
        )
        with self.stdout.open("w") as so, self.stderr.open("w") as se:
            self.proc = subprocess.Popen(
                argv,
                stdout=so,
                stderr=se,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200"},
            )

    def output(self) -> str:
        return f"stdout:\n{self.stdout.read_text()}\nstderr:\n{self.stderr.read_text()}"

    def wait_for(self, what: str, ready: Callable[[], bool], limit_s: float = 600) -> None:
        """Wait for a state of the output (not for a time); fail if the sink died."""
        deadline = time.monotonic() + limit_s
        while not ready():
            assert self.proc.poll() is None, f"the sink exited waiting for {what}\n{self.output()}"
            assert time.monotonic() < deadline, f"no {what} after {limit_s:.0f} s\n{self.output()}"
            time.sleep(0.5)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=300)


@pytest.fixture
def sink_and_upstream(
    kafka: Any, new_topic: Any, tmp_path: Path
) -> Iterator[tuple[Sink, Upstream, Path]]:
    topic = new_topic(partitions=2)
    out = tmp_path / "out"
    sink = Sink(kafka.bootstrap, topic, out, tmp_path / "ckpt", tmp_path)
    try:
        yield sink, Upstream(kafka.bootstrap, topic, tmp_path / "ledger.jsonl"), out
    finally:
        if sink.proc.poll() is None:
            os.killpg(sink.proc.pid, signal.SIGKILL)
            sink.proc.wait()


def written_rows(out: Path) -> int:
    """Rows in the sink's written table at ``out`` (0 before its first batch)."""
    try:
        return read_written(str(out)).num_rows
    except Exception:  # noqa: BLE001 - the tables do not exist before the first batch
        return 0


def _rejected(out: Path, verdict: str) -> int:
    try:
        rows = read_rejects(str(out))
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    return int(pc.sum(pc.equal(rows["verdict"], verdict)).as_py() or 0)


def spark_sql(spark: Any, path: Path, statements: list[str]) -> dict[str, Any]:
    """Run SQL on the table with Spark's own Delta (``{t}`` names it), then read it."""
    for sql in statements:
        spark.sql(sql.replace("{t}", f"delta.`{path}`")).collect()
    df = spark.read.format("delta").load(str(path))
    rows = [
        [
            r.topic,
            r.partition,
            r.offset,
            r.pid,
            r.seq,
            [[h.key, bytes(h.value).hex()] for h in r.headers or []],
        ]
        for r in df.where("pid >= 100").orderBy("topic", "partition", "offset").collect()
    ]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select(
        "version", "operation", "userMetadata", "operationParameters"
    )
    return {
        "rows": rows,
        "columns": df.columns,
        "history": [
            [h.version, h.operation, h.userMetadata, dict(h.operationParameters or {})]
            for h in history.collect()
        ],
    }


@pytest.mark.slow  # over a minute: handed out first under xdist (tests/README.md)
def test_the_sink_shares_its_table_and_stops_only_on_a_restore_before_its_last_batch(
    sink_and_upstream: tuple[Sink, Upstream, Path], spark: Any, tmp_path: Path
) -> None:
    sink, up, out = sink_and_upstream
    up.send(101, range(0, 50), 0)
    up.send(102, range(0, 50), 1)
    sink.wait_for("100 rows", lambda: written_rows(out) == 100)

    # delta-rs, beside the running sink: a blind append (a copy of a sink row and a row of its
    # own), properties, a new column.
    mine = read_log(str(out))
    copy = mine.filter(pc.and_(pc.equal(mine["pid"], 101), pc.equal(mine["seq"], 30)))
    own = mine.slice(0, 1)  # another producer's row: no log offset, a pid no ledger knows
    own = own.set_column(own.schema.get_field_index("pid"), "pid", pa.array([555], pa.int64()))
    own = own.set_column(
        own.schema.get_field_index("log_offset"), "log_offset", pa.nulls(1, pa.int64())
    )
    foreign = pa.concat_tables([copy, own])
    write_deltalake(str(out), foreign, mode="append")
    DeltaTable(str(out)).alter.set_table_properties(
        {"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 60 days"}
    )
    DeltaTable(str(out)).alter.add_columns([Field("region", PrimitiveType("string"), True)])
    up.send(101, range(50, 100), 0)
    up.send(102, range(50, 100), 1)
    sink.wait_for("200 rows", lambda: written_rows(out) == 200)

    # Table care and a retention delete by delta-rs, then upstream replays the deleted records.
    DeltaTable(str(out)).optimize.compact()
    DeltaTable(str(out)).optimize.z_order(["pid", "seq"])
    DeltaTable(str(out)).vacuum(0, enforce_retention_duration=False, dry_run=False)
    DeltaTable(str(out)).delete("pid = 102 AND seq < 20")
    up.send(102, range(0, 20), 1)
    sink.wait_for("20 DUPLICATE", lambda: _rejected(out, "DUPLICATE") == 20)

    # Spark's own Delta: a property and a delete, then the replay of what it deleted.
    spark_delta = has_delta(spark)
    if spark_delta:
        spark_sql(
            spark,
            out,
            [
                "ALTER TABLE {t} SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = "
                "'interval 2 days')",
                "DELETE FROM {t} WHERE pid = 101 AND seq < 5",
            ],
        )
        up.send(101, range(0, 5), 0)
        sink.wait_for("25 DUPLICATE", lambda: _rejected(out, "DUPLICATE") == 25)
    deleted = 20 + (5 if spark_delta else 0)
    up.send(101, range(100, 120), 0)
    sink.wait_for("220 rows", lambda: written_rows(out) == 220)

    # Exactly once: every acknowledged record in the table once, deleted ones gone for good.
    verify = subprocess.run(
        pidfence_argv(
            "verify", "--ledger", str(tmp_path / "ledger.jsonl"), "--output", str(out), "--json"
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert verify.returncode == EXIT_OK, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    counts = {name: f["count"] for name, f in report["findings"].items()}
    assert counts["foreign"] == 2 and counts["deleted"] == deleted, counts
    log = read_log(str(out))
    ours = log.filter(pc.is_valid(log["log_offset"]))
    assert ours.num_rows == 220 - deleted + 1  # + the foreign copy that kept its log_offset
    assert log.column_names[-1] == "region"
    for row in ours.to_pylist():
        if row["pid"] in (101, 102):
            key = (row["pid"], row["seq"])
            assert [(h["key"], h["value"]) for h in row["headers"]] == up.headers[key]
    back = ours.filter(pc.and_(pc.equal(ours["pid"], 102), pc.less(ours["seq"], 20)))
    assert back.num_rows == 0
    # Other engines read the same rows.
    assert pl.read_delta(str(out)).height == log.num_rows
    assert DeltaTable(str(out)).to_pyarrow_table().num_rows == log.num_rows
    commits = [c for c in DeltaTable(str(out)).history() if c.get(BATCH_KEY) is not None]
    assert all(c["userMetadata"].startswith("pidfence-sink query ") for c in commits)
    assert list((out / "_delta_log").glob("*.checkpoint.parquet"))
    if spark_delta:
        seen = spark_sql(spark, out, [])
        assert len(seen["rows"]) == 220 - deleted + 2  # Spark sees the foreign rows too
        assert "headers" in seen["columns"] and "region" in seen["columns"]
        epochs = [h[3].get("epochId") for h in seen["history"] if h[2]]
        assert epochs and all(e is not None for e in epochs)

    # A RESTORE to before the sink's last batch: the next batch stops the run, exit 3, one line.
    last = max(int(c["version"]) for c in commits)
    DeltaTable(str(out)).restore(last - 1)
    up.send(101, range(120, 130), 0)
    code = sink.proc.wait(timeout=600)
    lines = stderr_lines(sink.stderr.read_text())
    assert code == EXIT_UNAVAILABLE, sink.output()
    assert len(lines) == 1, sink.output()
    assert "(RESTORE" in lines[0] and "(RestoredPastSink; details in" in lines[0], lines[0]
    assert f"version {last - 1}" in lines[0] and "or later to continue" in lines[0]
