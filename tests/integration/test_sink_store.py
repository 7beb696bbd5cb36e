"""The sink on a real S3-API store (SeaweedFS): as a user runs it, with only the AWS environment.

Output and checkpoint live in the test's own bucket; the commands run in a working folder of
their own, which must hold nothing of the run but logs afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pidfence.cli.exits import EXIT_OK, EXIT_UNAVAILABLE
from pidfence.demo.procs import pidfence_argv
from pidfence.services import same_process
from pidfence.spark_sink import read_rejects, read_written
from tests.fixtures.commands import run_pidfence
from tests.fixtures.store import Bucket
from tests.integration.test_delta_shared import Upstream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _sink(
    bootstrap: str, topic: str, out: str, ckpt: str, *extra: str, master: str = "local[2]"
) -> list[str]:
    """``pidfence sink``'s arguments (URIs kept as given: ``Path()`` would drop a slash)."""
    where = ["--bootstrap", bootstrap, "--topic", topic, "--output", out, "--checkpoint", ckpt]
    return ["sink", *where, "--master", master, *extra]


def _rows(out: str) -> int:
    try:
        return read_written(out).num_rows
    except Exception:  # noqa: BLE001 - no table before the first batch
        return 0


def _left_but_logs(work: Path) -> list[str]:
    return sorted(
        str(p.relative_to(work))
        for p in work.rglob("*")
        if p.is_file()
        and not (p.parent.name == "pidfence-sink-logs" and p.suffix in (".log", ".properties"))
    )


def test_a_sink_on_s3_killed_mid_run_then_finished_has_every_event_once(
    kafka: Any, new_topic: Any, s3_bucket: Bucket, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    out, ckpt = f"{s3_bucket.uri}/lake/out", f"s3a://{s3_bucket.name}/lake/ckpt"
    work = tmp_path / "work"
    work.mkdir()
    up = Upstream(kafka.bootstrap, topic, tmp_path / "ledger.jsonl")
    up.send(101, range(0, 50), 0)
    up.send(102, range(0, 50), 1)

    streaming = pidfence_argv(*_sink(kafka.bootstrap, topic, out, ckpt, "--trigger", "1"))
    log = (tmp_path / "streaming.out").open("w")
    sink = subprocess.Popen(
        streaming, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 600
        while _rows(out) < 100:
            assert sink.poll() is None, (tmp_path / "streaming.out").read_text()
            assert time.monotonic() < deadline, (tmp_path / "streaming.out").read_text()
            time.sleep(0.5)
        up.send(101, range(50, 100), 0)
    finally:
        os.killpg(sink.pid, signal.SIGKILL)  # mid-run: a batch may be half written
        sink.wait(60)
        log.close()
    assert sink.returncode == -signal.SIGKILL
    up.send(101, range(40, 60), 0)  # replays: duplicates
    up.send(102, range(50, 100), 1)

    done = run_pidfence(
        *_sink(kafka.bootstrap, topic, out, ckpt, "--available-now"), timeout=600, cwd=work
    )
    assert done.returncode == EXIT_OK, done.stdout + done.stderr

    # delta-rs and Polars read the table with the same environment: each event once, in order.
    table = DeltaTable(out).to_pyarrow_table()
    frame = pl.read_delta(out)
    assert frame.height == table.num_rows == 200
    for pid, partition in ((101, 0), (102, 1)):
        rows = frame.filter(pl.col("pid") == pid).sort("log_offset")
        assert rows["partition"].unique().to_list() == [partition]
        assert rows["seq"].to_list() == list(range(100))
    rejects = read_rejects(out)
    dup = rejects.filter(pc.equal(rejects["verdict"], "DUPLICATE"))
    assert sorted(dup["seq"].to_pylist()) == list(range(40, 60))

    verify = run_pidfence(
        "verify",
        "--ledger",
        str(tmp_path / "ledger.jsonl"),
        "--output",
        out,
        "--json",
        timeout=300,
    )
    assert verify.returncode == EXIT_OK, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"]
    assert _left_but_logs(work) == []


def test_a_checkpoint_in_a_missing_bucket_says_the_cause_and_the_fix(
    kafka: Any, new_topic: Any, s3_bucket: Bucket, tmp_path: Path
) -> None:
    topic = new_topic()
    argv = _sink(
        kafka.bootstrap,
        topic,
        f"{s3_bucket.uri}/out",
        "s3a://no-such-bucket/ckpt",
        "--available-now",
    )
    plain = run_pidfence(*argv, timeout=600, cwd=tmp_path)
    assert plain.returncode == EXIT_UNAVAILABLE, plain.stdout + plain.stderr
    line = plain.stderr.strip().splitlines()[-1]
    assert "An error occurred while calling" not in line, line
    assert "create the bucket" in line, line
    assert "Exception: " in line, line  # the Java class of the root cause
    verbose = run_pidfence(*argv, "--verbose", timeout=600, cwd=tmp_path)
    assert verbose.returncode == EXIT_UNAVAILABLE
    assert "\tat org.apache" in verbose.stderr, verbose.stderr[-3000:]  # the stack
    assert "create the bucket" in verbose.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("bucket", "env", "fix"),
    [
        ("no-such-bucket", {}, "create the bucket"),
        ("", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "refused the credentials"),
        ("", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "the store did not answer"),
        # Nothing exported (empty is unset): AWS S3 itself, and no credentials for it.
        (
            "",
            {"AWS_ENDPOINT_URL": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
            "check the AWS environment",
        ),
    ],
    ids=["missing-bucket", "wrong-secret", "no-store", "no-environment"],
)
def test_an_output_on_an_unusable_store_is_one_line_and_exit_3_before_spark_starts(
    kafka: Any,
    new_topic: Any,
    s3_bucket: Bucket,
    tmp_path: Path,
    bucket: str,
    env: dict[str, str],
    fix: str,
) -> None:
    out = f"s3://{bucket or s3_bucket.name}/out"
    argv = _sink(kafka.bootstrap, new_topic(), out, str(tmp_path / "ckpt"), "--available-now")
    result = run_pidfence(*argv, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == EXIT_UNAVAILABLE, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"pidfence sink: error: {out} (store "), lines
    assert fix in lines[-1], lines
    assert "Traceback" not in result.stderr
    assert "Spark and JVM log" not in result.stdout  # refused before Spark started
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


@pytest.mark.parametrize(
    "command", [["verify", "--ledger", "LEDGER"], ["sink", "compact"], ["sink", "vacuum"]]
)
def test_a_care_command_or_verify_on_a_missing_bucket_is_one_line_and_exit_3(
    s3_bucket: Bucket, tmp_path: Path, command: list[str]
) -> None:
    del s3_bucket  # the AWS environment of a store that answers
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    out = "s3://no-such-bucket/out"
    args = [str(ledger) if a == "LEDGER" else a for a in command]
    args += ["--output", out] if command[0] == "verify" else [out]
    result = run_pidfence(*args, timeout=120)
    assert result.returncode == EXIT_UNAVAILABLE, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "bucket no-such-bucket does not exist" in line, result.stderr
    assert "create the bucket" in line
    assert "Traceback" not in result.stderr


def test_services_up_s3_prints_the_environment_and_down_stops_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "services"
    up = run_pidfence("services", "up", "--s3", "--run-dir", str(run_dir), timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        env = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export ")
        )
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        state = json.loads((run_dir / "state.json").read_text())
        store = next(n for n in state["nodes"] if n["name"] == "seaweedfs-0")
        from pidfence.services.seaweedfs import s3_client

        client = s3_client(env)
        client.create_bucket(Bucket="lake")
        client.put_object(Bucket="lake", Key="k", Body=b"v", IfNoneMatch="*")
    finally:
        down = run_pidfence("services", "down", "--run-dir", str(run_dir), timeout=120)
    assert down.returncode == 0 and "seaweedfs-0" in down.stdout, down.stdout + down.stderr
    assert not same_process(store["pid"], store["start_time"])


def test_a_cluster_that_shares_nothing_but_the_store(
    kafka: Any, new_topic: Any, spark_standalone: Any, s3_bucket: Bucket, tmp_path: Path
) -> None:
    workers = [spark_standalone.work_dir(i) for i in range(spark_standalone.workers)]
    assert len(set(workers)) == 2
    topic = new_topic(partitions=2)
    out, ckpt = f"{s3_bucket.uri}/out", f"{s3_bucket.uri}/ckpt"
    up = Upstream(kafka.bootstrap, topic, tmp_path / "ledger.jsonl")
    up.send(201, range(0, 30), 0)
    up.send(202, range(0, 30), 1)
    up.send(201, range(10, 20), 0)
    argv = _sink(
        kafka.bootstrap, topic, out, ckpt, "--available-now", master=spark_standalone.master_url
    )
    done = run_pidfence(*argv, timeout=600, cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    frame = pl.read_delta(out)
    for pid in (201, 202):
        assert frame.filter(pl.col("pid") == pid).sort("log_offset")["seq"].to_list() == list(
            range(30)
        )
    rejects = read_rejects(out)
    assert pc.sum(pc.equal(rejects["verdict"], "DUPLICATE")).as_py() == 10
    # The executors ran in the workers' own folders and left nothing of the output there.
    assert any(any(w.glob("app-*")) for w in workers), workers
    kept = [p for w in workers for p in w.rglob("*") if p.suffix in (".parquet", ".json")]
    assert kept == []
