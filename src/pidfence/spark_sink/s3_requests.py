"""The sink's own requests to S3: create-if-absent as a conditional put (``If-None-Match: *``),
the probe that refuses a store ignoring it, and whole-object put, get and delete.

AWS S3, MinIO, SeaweedFS and R2 answer such a put with 412 Precondition Failed when the key
exists; delta-rs (1.0 on) commits a Delta version the same way. A store that ignores the header
overwrites instead, and two writers would both "create" one commit: :func:`probe` finds that
out before the sink writes anything. The client is boto3's (pyarrow's S3 file system has no
conditional put), configured from the same AWS environment as pyarrow and delta-rs.

:func:`put`, :func:`get` and :func:`delete` are one request each. Through pyarrow's S3 file system
a small put cost eight (a folder marker per level of the key, a multipart upload of one part), a
read two and a delete three (it re-creates the parent's marker), counted on SeaweedFS; a local
disk hides that, an object store bills and waits for each. Their errors are ``OSError`` (a missing
key ``FileNotFoundError``), as pyarrow's are, so callers handle a store that blips as before.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

from pidfence.spark_sink.errors import SinkError
from pidfence.spark_sink.jvm_cause import fix_for
from pidfence.spark_sink.object_store import is_s3

#: How often a put that met a concurrent conditional write (409) is tried again.
_CONFLICT_RETRIES = 5
#: Seconds to connect to the store, and to wait for an answer, before a request is tried again.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 20
#: Attempts per request (botocore's standard retry mode: throttling, 5xx, timeouts).
ATTEMPTS = 3


class StoreUnusable(SinkError):
    """The object store refused or did not answer the sink's first write (no bucket, wrong
    credentials, no store at the endpoint); the message names the fix."""


class StoreIgnoresConditions(SinkError):
    """The object store overwrote a key that a conditional put (``If-None-Match: *``) found
    present: the sink's commits cannot be atomic on it."""

    retriable: ClassVar[bool] = False


@functools.cache
def _client(pid: int, endpoint: str | None, region: str | None, key: str | None) -> Any:
    """One boto3 client per process, endpoint and access key (clients do not survive a fork;
    a session reads the credentials once)."""
    del pid, key
    import boto3
    from botocore.config import Config

    # botocore waits 60 s to connect and 60 s to read, five times over, before it fails: a
    # stopped store would hold a task for minutes. pyarrow's S3 client gives up in seconds,
    # and Spark retries the task; these bounds keep both alike.
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": ATTEMPTS},
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, config=config
    )


def client() -> Any:
    """A boto3 S3 client from the AWS environment."""
    env = os.environ
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    key = env.get("AWS_ACCESS_KEY_ID")
    return _client(os.getpid(), env.get("AWS_ENDPOINT_URL") or None, region, key)


def _os_error(path: str, exc: Exception) -> OSError:
    """boto3's error as pyarrow's file systems raise it: a missing key (or bucket)
    ``FileNotFoundError``, any other failure ``OSError``."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404 or error.get("Code") in {"NoSuchKey", "NoSuchBucket"}:
            return FileNotFoundError(f"s3://{path}: {error.get('Code', status)}")
    return OSError(f"s3://{path}: {exc}")


@contextlib.contextmanager
def _as_os_error(path: str) -> Iterator[None]:
    """boto3's errors in the block as :func:`_os_error` makes them."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise _os_error(path, exc) from exc


def put(path: str, data: bytes) -> None:
    """Write or replace ``bucket/key`` with ``data`` (one PUT: readers see the old or the new
    object, never a mix)."""
    bucket, _, key = path.partition("/")
    with _as_os_error(path):
        client().put_object(Bucket=bucket, Key=key, Body=data)


def get(path: str) -> bytes:
    """The whole object ``bucket/key`` (one GET)."""
    bucket, _, key = path.partition("/")
    with _as_os_error(path):
        return bytes(client().get_object(Bucket=bucket, Key=key)["Body"].read())


def delete(path: str) -> None:
    """Remove ``bucket/key`` if present (one DELETE; S3 answers a missing key alike)."""
    bucket, _, key = path.partition("/")
    with _as_os_error(path):
        client().delete_object(Bucket=bucket, Key=key)


def put_if_absent(path: str, data: bytes) -> bool:
    """Create ``bucket/key`` with ``data`` unless it exists; True if this call created it.

    Raises:
        OSError: the store failed the request (as :func:`put`'s do).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = path.partition("/")
    conflicts = 0
    while True:
        try:
            client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 412:
                return False
            conflicts += 1  # 409: a concurrent conditional put to the key; ask again
            if status != 409 or conflicts >= _CONFLICT_RETRIES:
                raise _os_error(path, exc) from exc
        except BotoCoreError as exc:
            raise _os_error(path, exc) from exc


def _fix(text: str) -> str:
    return fix_for(text) or "check the AWS environment (AWS_ENDPOINT_URL, credentials)"


def reach(bucket_path: str, where: str) -> None:
    """Refuse a store the sink cannot use before reading or writing anything there: one HEAD of
    the bucket says whether it exists, whether the credentials are accepted and whether a store
    answers at all.

    Args:
        bucket_path: a folder as pyarrow's S3 file system names it (``bucket/prefix``), or as
            the user does (``s3://bucket/prefix``).
        where: how messages name the store (the user's URI).

    Raises:
        StoreUnusable: the bucket is missing, the credentials were refused, or no store answered
            (the message names the fix).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket = bucket_path.split("://", 1)[-1].partition("/")[0]
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
    try:
        client().head_bucket(Bucket=bucket)
    except ClientError as exc:
        # A HEAD has no body: the status is all the store says.
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        said = {404: f"bucket {bucket} does not exist", 403: "403 Forbidden"}.get(status)
        said = said or str(exc)
        raise StoreUnusable(f"{where} (store {endpoint}): {said}; {_fix(said)}") from exc
    except (BotoCoreError, ValueError) as exc:  # ValueError: an endpoint that is no URL
        raise StoreUnusable(f"{where} (store {endpoint}): {exc}; {_fix(str(exc))}") from exc


def reach_stores(*paths: str | None) -> None:
    """:func:`reach` the store of each ``s3://`` or ``s3a://`` path among ``paths`` (the others,
    and None, are skipped), each named as given.

    Raises:
        StoreUnusable: the store of one of ``paths`` cannot be used.
    """
    for path in paths:
        if path is not None and is_s3(path):
            reach(path, path)


def probe(bucket_path: str, where: str) -> None:
    """Put one fresh key twice, conditionally: the second must be refused.

    Args:
        bucket_path: a folder as pyarrow's S3 file system names it (``bucket/prefix``).
        where: how messages name the store (the user's URI).

    Raises:
        StoreIgnoresConditions: the second put overwrote the first.
        StoreUnusable: the store refused the put or did not answer.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    key = f"{bucket_path.rstrip('/')}/_pidfence/probe-{uuid.uuid4().hex}"
    bucket, _, name = key.partition("/")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
    first = False
    try:
        first = put_if_absent(key, b"1")
        second = put_if_absent(key, b"2")
        client().delete_object(Bucket=bucket, Key=name)
    except (BotoCoreError, ClientError, OSError) as exc:
        if first:  # never leave the probe's key under the user's prefix
            with contextlib.suppress(BotoCoreError, ClientError):
                client().delete_object(Bucket=bucket, Key=name)
        said = exc.__cause__ or exc  # boto3's own words, under put_if_absent's OSError
        raise StoreUnusable(f"{where} (store {endpoint}): {said}; {_fix(str(said))}") from exc
    if first and not second:
        return
    raise StoreIgnoresConditions(
        f"{where}: the store at {endpoint} ignores conditional writes (a put with If-None-Match: "
        "* overwrote an existing key), so two writers could both commit one batch. Use a store "
        "that honours them (AWS S3, MinIO, SeaweedFS, Cloudflare R2) or upgrade this one"
    )


__all__ = [
    "StoreIgnoresConditions",
    "StoreUnusable",
    "client",
    "delete",
    "get",
    "probe",
    "put",
    "put_if_absent",
    "reach",
    "reach_stores",
]
