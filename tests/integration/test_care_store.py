"""``pidfence sink compact`` on an object store (SeaweedFS's S3 API), as a user runs it: a data
file deleted outside Delta is named, with its version, and exits 3 as it does on a local disk."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pidfence.cli.exits import EXIT_OK, EXIT_UNAVAILABLE
from pidfence.spark_sink.storage import Store
from tests.fixtures.commands import run_pidfence
from tests.fixtures.store import Bucket
from tests.unit.test_verify_cli import write_output

pytestmark = pytest.mark.integration


def test_compact_on_s3_names_a_data_file_deleted_by_hand_and_exits_3(
    s3_output: str, s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = s3_output
    table = DeltaTable(path)
    lost = sorted(table.file_uris())[0]
    rel = lost.removeprefix(path + "/")
    store = Store.at(path)
    assert store.s3
    store.fs.delete_file(lost.removeprefix("s3://"))
    result = run_pidfence("sink", "compact", path, timeout=120)
    assert result.returncode == EXIT_UNAVAILABLE, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"version {table.version()} of the Delta table adds {rel}," in line, result.stderr
    assert "FSCK REPAIR TABLE" in line and "Traceback" not in result.stderr
    # The same command on an intact output compacts it.
    intact = f"{s3_bucket.uri}/intact"
    write_output(intact, monkeypatch)
    result = run_pidfence("sink", "compact", intact, timeout=120)
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    assert "log " + intact in result.stdout
