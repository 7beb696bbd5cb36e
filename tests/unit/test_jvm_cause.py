"""A JVM failure is told by its root cause (class and message) and the fix, not by py4j's call."""

from __future__ import annotations

import pytest

from pidfence.spark_sink.failure import SparkQueryFailed, failure_of
from pidfence.spark_sink.jvm_cause import explain, root_cause

#: What py4j's ``Py4JJavaError`` says when ``DataStreamWriter.start()`` meets an s3a:// checkpoint
#: without hadoop-aws (pyspark 4.2, local mode).
NO_S3A = """An error occurred while calling o77.start.
: java.lang.RuntimeException: java.lang.ClassNotFoundException: Class \
org.apache.hadoop.fs.s3a.S3AFileSystem not found
\tat org.apache.hadoop.conf.Configuration.getClass(Configuration.java:2737)
\tat org.apache.hadoop.fs.FileSystem.getFileSystemClass(FileSystem.java:3569)
\tat org.apache.spark.sql.execution.streaming.StreamExecution.<init>(StreamExecution.scala:79)
Caused by: java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not \
found
\tat org.apache.hadoop.conf.Configuration.getClassByName(Configuration.java:2641)
\t... 25 more
"""

BAD_KEY = """An error occurred while calling o81.start.
: java.nio.file.AccessDeniedException: s3a://lake/ckpt/metadata: getFileStatus on \
s3a://lake/ckpt/metadata: software.amazon.awssdk.services.s3.model.S3Exception: (Service: S3, \
Status Code: 403, Request ID: 18EC5)
\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:271)
Caused by: software.amazon.awssdk.services.s3.model.S3Exception: The AWS Access Key Id you \
provided does not exist in our records. (Service: S3, Status Code: 403, Request ID: 18EC5)
\tat software.amazon.awssdk.services.s3.model.S3Exception$BuilderImpl.build(S3Exception.java:1)
"""

NO_BUCKET = """An error occurred while calling o77.start.
: java.io.FileNotFoundException: Bucket nolake does not exist
\tat org.apache.hadoop.fs.s3a.S3AFileSystem.verifyBucketExists(S3AFileSystem.java:1)
Caused by: software.amazon.awssdk.services.s3.model.NoSuchBucketException: The specified bucket \
does not exist (Service: S3, Status Code: 404)
"""


def test_the_root_cause_is_the_last_caused_by() -> None:
    cause = root_cause(NO_S3A)
    assert cause is not None
    assert cause.cls == "java.lang.ClassNotFoundException"
    assert str(cause) == (
        "ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    )


def test_of_several_caused_by_lines_the_deepest_is_the_cause() -> None:
    text = (
        "An error occurred while calling o42.start.\n"
        ": org.apache.spark.SparkException: Job aborted.\n"
        "Caused by: java.io.IOException: commit failed\n"
        "\tat org.apache.hadoop.fs.s3a.S3AFileSystem.rename(S3AFileSystem.java:1)\n"
        "Caused by: java.net.ConnectException: Connection refused\n"
        "\t... 12 more\n"
    )
    assert str(root_cause(text)) == "ConnectException: Connection refused"
    assert explain(text) == (
        "ConnectException: Connection refused; the store did not answer: check "
        "AWS_ENDPOINT_URL and that the store runs"
    )


def test_a_refused_connection_is_the_stores_only_where_the_failure_names_the_store() -> None:
    """A Spark master or YARN that refuses the driver is no store to check AWS_ENDPOINT_URL
    for."""
    text = (
        "An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult\n"
        "Caused by: java.net.ConnectException: Connection refused: master/10.0.0.5:7077\n"
    )
    assert explain(text) == "ConnectException: Connection refused: master/10.0.0.5:7077"


def test_an_unchained_exception_is_its_own_cause() -> None:
    text = "An error occurred while calling o9.load.\n: java.lang.IllegalStateException: gone\n"
    assert str(root_cause(text)) == "IllegalStateException: gone"
    assert root_cause("no Java here") is None


@pytest.mark.parametrize(
    ("text", "cause", "fix"),
    [
        (NO_S3A, "S3AFileSystem not found", "hadoop-aws"),
        (BAD_KEY, "S3Exception: The AWS Access Key Id", "AWS_ACCESS_KEY_ID"),
        (NO_BUCKET, "NoSuchBucketException: The specified bucket", "create the bucket"),
    ],
)
def test_the_line_names_the_cause_and_the_fix(text: str, cause: str, fix: str) -> None:
    line = explain(text)
    assert line is not None
    assert cause in line and fix in line
    assert "o77" not in line and "o81" not in line


def test_a_python_workers_traceback_is_left_to_the_sinks_reading() -> None:
    text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "x.py", line 1\nValueError: bad\n'
    )
    assert explain(text) is None


def test_a_failed_query_says_its_root_cause() -> None:
    class Captured(Exception):
        pass

    found = failure_of(Captured("[STREAM_FAILED] Query terminated with exception:\n" + BAD_KEY))
    assert type(found) is SparkQueryFailed
    assert "Access Key Id" in str(found) and "AWS_SECRET_ACCESS_KEY" in str(found)
