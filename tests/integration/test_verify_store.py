"""``verify`` on an object store (SeaweedFS's S3 API): deltalake names each row's data file
relative to the table root there as on a local disk, so a row's file tells the sink's own files
from another writer's."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.spark_sink.readers import FILE_COLUMN, read_data_files, read_log
from tests.fixtures.store import Bucket
from tests.unit.test_verify_judging import assert_an_extra_copy_in_a_sink_file_is_a_duplicate

pytestmark = pytest.mark.integration


def test_each_rows_file_on_s3_is_named_as_the_sinks_commits_added_it(s3_output: str) -> None:
    path = s3_output
    files = set(read_log(path, with_files=True)[FILE_COLUMN].to_pylist())
    assert files and files <= read_data_files(path), (files, read_data_files(path))


def test_an_extra_copy_inside_a_sink_data_file_on_s3_is_a_duplicate(
    s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_an_extra_copy_in_a_sink_file_is_a_duplicate(
        tmp_path, monkeypatch, f"{s3_bucket.uri}/out"
    )
