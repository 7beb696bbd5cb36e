"""`pidfence demo --store s3`: the main job with the sink's output and checkpoint on an S3 store
(SeaweedFS) the demo starts, on the session's Kafka and ZooKeeper.

Run as a user who wants to look at the table afterwards: ``--keep-running`` leaves the lease
servers and the store up and prints the AWS environment that reaches the store; the test reads
the table with delta-rs in that environment, then stops what was kept with the ``kill`` line the
demo printed, and finds no process of the run left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pidfence.cli.exits import EXIT_OK
from pidfence.services.seaweedfs import s3_client
from tests.fixtures.commands import run_pidfence
from tests.fixtures.demo import left_running, small_demo_args, summary_of

pytestmark = pytest.mark.timeout(600)

#: What the demo leaves in ``--out`` with ``--bootstrap`` and ``--zk``: its own records, the
#: store's data (``run/s3``) and logs; no ``output`` or ``checkpoint`` folder.
DEMO_FILES = {"ledgers", "logs", "state", "run", ".pidfence-demo", "summary.json", "report.html"}


def _stop(pids: list[int], timeout: float = 60.0) -> None:
    """SIGTERM each pid, then wait until every one is gone (SIGKILL after ``timeout``)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    for pid in pids:
        while Path(f"/proc/{pid}").exists():
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


def test_demo_on_an_s3_store_checks_the_table_there_and_keeps_nothing_of_it_local(
    tmp_path: Path, kafka: Any, zookeeper: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    argv = small_demo_args(kafka, zookeeper, out)
    result = run_pidfence(
        argv[0], "--store", "s3", "--keep-running", *argv[1:], timeout=500, cwd=work
    )
    console = result.stdout + result.stderr
    kill = re.search(r"Stop them with: kill ([\d ]+)", result.stdout)
    kept = [int(p) for p in kill.group(1).split()] if kill else []
    try:
        summary, verdict = summary_of(result, out, ("anomalies", "examples", "faults"))
        assert result.returncode == EXIT_OK, (console[-3000:], verdict)
        assert summary["ok"], verdict
        assert all(summary["faults_happened"].values()), summary["faults"]
        # The checker read the table from the store.
        assert summary["output"] == "s3://demo/output"
        services = json.loads((out / "services.json").read_text())
        env = services["store"]
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:"), env
        assert kill is not None and services["pids"]["seaweedfs-0"] in kept, result.stdout
        for name in env:  # the environment the demo printed to read the table with
            assert f"export {name}={env[name]}" in result.stdout, result.stdout
            monkeypatch.setenv(name, env[name])

        log = DeltaTable("s3://demo/output").to_pyarrow_table()
        rejects = DeltaTable("s3://demo/output/_rejects").to_pyarrow_table()
        assert log.num_rows == summary["counts"]["appended"] > 0
        assert rejects.num_rows == summary["counts"]["rejected"] > 0
        listed = s3_client(env).list_objects_v2(Bucket="demo", Prefix="checkpoint/commits/")
        assert listed.get("KeyCount", 0) >= 2, listed  # Spark's checkpoint, both passes

        # Nothing of the table or the checkpoint on the local disk: not in the working folder,
        # not in --out.
        assert sorted(p.name for p in work.iterdir()) == []
        assert {p.name for p in out.iterdir()} <= DEMO_FILES | {"services.json"}
        local = [
            p for p in out.rglob("*") if p.suffix in (".parquet", ".crc") or "_delta_log" in p.parts
        ]
        assert local == []
    finally:
        _stop(kept)
    assert left_running(out) == []
