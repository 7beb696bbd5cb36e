"""S3 paths as each library names them, Spark's s3a settings from the AWS environment, and the
conditional-put probe's refusal of a store that ignores ``If-None-Match``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from pidfence.cli.exits import EXIT_UNAVAILABLE, EXIT_USAGE, code_of
from pidfence.spark_sink import object_store, s3_requests
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.object_store import (
    arrow_uri,
    is_s3,
    session_conf,
    spark_conf,
    storage_options,
)

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
    for bad in ("AWS_REGION", "region=eu", "spark.master=local", "fs.defaultFS=file:///"):
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


def refusal(status: int) -> ClientError:
    """What boto3 raises for a request the store answered with ``status``."""
    return ClientError(
        {"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


class HonouringStore(IgnoringStore):
    """A store that refuses a conditional put of a key it holds (412), as S3 does."""

    def put_object(self, Bucket: str, Key: str, Body: bytes, **conditions: Any) -> None:
        if conditions.get("IfNoneMatch") == "*" and (Bucket, Key) in self.objects:
            raise refusal(412)
        super().put_object(Bucket, Key, Body)


class AnsweringStore:
    """A store that answers every put and HEAD with the statuses queued (None: success)."""

    def __init__(self, *answers: int | None) -> None:
        self.answers = list(answers)
        self.puts = 0

    def _answer(self) -> None:
        status = self.answers.pop(0) if self.answers else None
        if status is not None:
            raise refusal(status)

    def put_object(self, **_: Any) -> None:
        self.puts += 1
        self._answer()

    def head_bucket(self, Bucket: str) -> None:
        self._answer()


def test_a_store_that_honours_if_none_match_passes_the_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = HonouringStore()
    monkeypatch.setattr(s3_requests, "client", lambda: store)
    s3_requests.probe("lake/out", "s3://lake/out")
    assert store.objects == {}  # the probe key is gone


class FailingSecondPut(HonouringStore):
    """A store that takes the probe's first put and refuses the second (403)."""

    def put_object(self, Bucket: str, Key: str, Body: bytes, **conditions: Any) -> None:
        if self.objects:
            raise refusal(403)
        super().put_object(Bucket, Key, Body, **conditions)


def test_a_probe_refused_halfway_leaves_no_key_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    store = FailingSecondPut()
    monkeypatch.setattr(s3_requests, "client", lambda: store)
    with pytest.raises(s3_requests.StoreUnusable):
        s3_requests.probe("lake/out", "s3://lake/out")
    assert store.objects == {}


def test_a_conditional_put_of_a_present_key_creates_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = HonouringStore()
    monkeypatch.setattr(s3_requests, "client", lambda: store)
    assert s3_requests.put_if_absent("lake/out/_delta_log/0.json", b"first")
    assert not s3_requests.put_if_absent("lake/out/_delta_log/0.json", b"second")
    assert store.objects == {("lake", "out/_delta_log/0.json"): b"first"}


def test_only_a_concurrent_conditional_put_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    conflicted = AnsweringStore(409, 409, None)
    monkeypatch.setattr(s3_requests, "client", lambda: conflicted)
    assert s3_requests.put_if_absent("lake/k", b"x")
    assert conflicted.puts == 3
    forbidden = AnsweringStore(403, None)
    monkeypatch.setattr(s3_requests, "client", lambda: forbidden)
    with pytest.raises(OSError, match=r"s3://lake/k: .*403"):
        s3_requests.put_if_absent("lake/k", b"x")
    assert forbidden.puts == 1


def test_a_conditional_put_the_store_did_not_answer_is_an_os_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """put_if_absent let botocore's own errors out, unlike every other S3 request: a store
    blip while a standby took over (or a sink claimed its output) was no OSError, which the
    claim retries, so the process died and the CLI exited 3, not 75."""
    for key, value in STORE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(OSError, match="s3://lake/k: Could not connect"):
        s3_requests.put_if_absent("lake/k", b"x")


@pytest.mark.parametrize(
    ("status", "said", "fix"),
    [
        (404, "bucket lake does not exist", "create the bucket"),
        (403, "403 Forbidden", "AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_an_unusable_store_is_refused_with_what_it_said_and_the_fix(
    status: int, said: str, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_requests, "client", lambda: AnsweringStore(status))
    with pytest.raises(s3_requests.StoreUnusable) as info:
        s3_requests.reach("s3://lake/out", "s3://lake/out")
    assert said in str(info.value) and fix in str(info.value)
    assert code_of(info.value) == EXIT_UNAVAILABLE


def test_a_changed_access_key_gets_a_client_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in STORE.items():
        monkeypatch.setenv(key, value)
    first = s3_requests.client()
    assert s3_requests.client() is first
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rotated")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rotated-secret")
    assert s3_requests.client() is not first


def test_a_session_with_any_s3_path_gets_the_s3a_jars_and_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jars = [Path("/jars/hadoop-aws.jar"), Path("/jars/bundle.jar")]
    monkeypatch.setattr(object_store, "s3a_jars", lambda: jars)
    conf = session_conf(["/data/out", "s3a://lake/ckpt"])
    assert conf["spark.driver.extraClassPath"] == os.pathsep.join(map(str, jars))
    assert conf["spark.hadoop.fs.s3a.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert session_conf(["/data/out", "file:///data/ckpt"]) == {}


def test_an_endpoint_that_is_no_url_is_an_unusable_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AWS_ENDPOINT_URL=localhost:9000`` (no scheme): boto3 raises ValueError, which escaped
    as a traceback (exit 1, "anomalies", from ``pidfence verify``)."""
    s3_requests._client.cache_clear()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "localhost:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    try:
        with pytest.raises(s3_requests.StoreUnusable, match="localhost:9000"):
            s3_requests.reach("s3://bucket/out", "s3://bucket/out")
    finally:
        s3_requests._client.cache_clear()


def test_verify_without_boto3_reads_the_output_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install 'pidfence[verify]'`` brings no boto3: the store check before the read is
    skipped (the read names what fails), where ``ModuleNotFoundError`` escaped (exit 1)."""
    from pidfence.verify import output

    def no_boto3(*paths: object) -> None:
        raise ModuleNotFoundError("No module named 'botocore'", name="botocore")

    monkeypatch.setattr(s3_requests, "reach_stores", no_boto3)
    output._reach_stores("s3://bucket/out", None)
