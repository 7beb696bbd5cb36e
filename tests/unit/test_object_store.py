"""S3 paths as each library names them, Spark's s3a settings from the AWS environment, and the
conditional-put probe's refusal of a store that ignores ``If-None-Match``."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.cli.exits import EXIT_UNAVAILABLE, EXIT_USAGE, code_of
from pidfence.spark_sink import s3_requests
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.object_store import arrow_uri, is_s3, spark_conf, storage_options

STORE = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
    "AWS_ACCESS_KEY_ID": "id",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_REGION": "eu-west-1",
}


def test_paths_are_named_as_each_library_knows_them() -> None:
    assert arrow_uri("s3a://lake/ckpt") == "s3://lake/ckpt"
    assert arrow_uri("s3://lake/out") == "s3://lake/out"
    assert arrow_uri("/tmp/out") == "/tmp/out"
    assert is_s3("s3a://lake") and is_s3("s3://lake") and not is_s3("/s3://x")


def test_s3a_gets_the_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in STORE.items():
        monkeypatch.setenv(key, value)
    conf = spark_conf({"fs.s3a.connection.maximum": "8"}, master="spark://m:7077")
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert not any("secret" in key for key in conf)  # S3A reads them from the environment
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3.impl"] == conf["spark.hadoop.fs.s3a.impl"]
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == STORE["AWS_SECRET_ACCESS_KEY"]
    assert conf["spark.hadoop.fs.s3a.connection.maximum"] == "8"
    assert not any(k.startswith("spark.executorEnv") for k in spark_conf(master="local[2]"))


def test_storage_options_are_aws_variables_or_s3a_settings() -> None:
    assert storage_options(["AWS_REGION=x=y", "fs.s3a.fast.upload=true"]) == {
        "AWS_REGION": "x=y",
        "fs.s3a.fast.upload": "true",
    }
    for bad in ("AWS_REGION", "region=eu", "spark.master=local"):
        with pytest.raises(SinkOptionError) as info:
            storage_options([bad])
        assert code_of(info.value) == EXIT_USAGE


class IgnoringStore:
    """A store that overwrites whatever the headers say (no conditional writes)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    def put_object(self, Bucket: str, Key: str, Body: bytes, **conditions: Any) -> None:
        self.objects[(Bucket, Key)] = Body

    def delete_object(self, Bucket: str, Key: str) -> None:
        self.objects.pop((Bucket, Key), None)


def test_a_store_that_ignores_if_none_match_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    store = IgnoringStore()
    monkeypatch.setattr(s3_requests, "client", lambda: store)
    with pytest.raises(s3_requests.StoreIgnoresConditions) as info:
        s3_requests.probe("lake/out", "s3://lake/out")
    assert code_of(info.value) == EXIT_UNAVAILABLE
    assert "If-None-Match" in str(info.value) and "SeaweedFS" in str(info.value)
    assert store.objects == {}  # the probe key is gone
