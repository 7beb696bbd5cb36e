"""What each of the sink's store operations costs on a real S3 store (SeaweedFS), counted by the
store itself (its Prometheus request counters), and how its failures reach the callers.

A local disk hides the requests an object store bills and waits for: through pyarrow's S3 file
system a small put cost eight (a folder marker per level, a one-part multipart upload), a read
two, a delete three. The sink's operations are one request each.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pidfence.services.ports import free_port
from pidfence.services.seaweedfs import SeaweedFS
from pidfence.spark_sink.storage import Store
from tests.fixtures.store import _need_weed

pytestmark = [pytest.mark.integration]


class MeteredSeaweedFS(SeaweedFS):
    """SeaweedFS serving its Prometheus metrics, to count the S3 requests it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics_port = free_port()

    def _node(self, i: int) -> tuple[list[str], Path, int, str]:
        cmd, node_dir, port, what = super()._node(i)
        return [*cmd, f"-metricsPort={self.metrics_port}"], node_dir, port, what

    def requests(self) -> Counter[str]:
        """S3 requests answered so far, by method and status (``PUT/200``)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        counts: Counter[str] = Counter()
        for line in text.splitlines():
            if line.startswith("SeaweedFS_s3_request_total{"):
                labels, value = line.rsplit(" ", 1)
                kind = re.search(r'type="([^"]+)"', labels)
                code = re.search(r'code="([^"]+)"', labels)
                if kind and code:
                    counts[f"{kind.group(1)}/{code.group(1)}"] += int(float(value))
        return counts


@pytest.fixture
def metered(monkeypatch: pytest.MonkeyPatch) -> Iterator[MeteredSeaweedFS]:
    _need_weed()
    store = MeteredSeaweedFS().start()
    try:
        for key, value in store.environment().items():
            monkeypatch.setenv(key, value)
        store.make_bucket("lake")
        yield store
    finally:
        if store[0].running:
            store.kill(0)  # its data is thrown away: SeaweedFS's own graceful stop takes 15 s
        store.stop()


def _settled(store: MeteredSeaweedFS) -> Counter[str]:
    """The request counts once they stop moving.

    SeaweedFS counts a request after its handler returns, so after the response is on its way: a
    client can read its answer, and the metrics, before the count is taken. Two reads 0.2 s apart
    that agree have nothing left in flight (this test sends nothing meanwhile).
    """
    deadline = time.monotonic() + 10
    counts = store.requests()
    while True:
        time.sleep(0.2)
        again = store.requests()
        if again == counts or time.monotonic() > deadline:
            return again
        counts = again


def _cost(store: MeteredSeaweedFS, operation: Callable[[], object]) -> dict[str, int]:
    before = _settled(store)
    operation()
    after = _settled(store)
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_each_operation_is_one_request(metered: MeteredSeaweedFS) -> None:
    store = Store.at("s3://lake/out/log")
    key = store.join("_pidfence", "manifests", "00000000000000000001")
    rows = pa.table({"seq": list(range(1000))})
    data = store.join("data", "q", "1", "part-0.parquet")
    assert _cost(metered, lambda: store.put(key, b"m")) == {"PUT/200": 1}
    assert _cost(metered, lambda: store.put(key, b"m2")) == {"PUT/200": 1}
    assert _cost(metered, lambda: store.put_if_absent(key, b"x")) == {"PUT/412": 1}
    assert _cost(metered, lambda: store.read(key)) == {"GET/200": 1}
    assert _cost(metered, lambda: store.write_table(data, rows)) == {"PUT/200": 1}
    assert _cost(metered, lambda: store.read_table(data)) == {"GET/200": 1}
    assert _cost(metered, lambda: store.delete(key)) == {"DELETE/204": 1}


def test_what_was_put_reads_back_and_failures_are_os_errors(metered: MeteredSeaweedFS) -> None:
    store = Store.at("s3://lake/out/log")
    rows = pa.table({"seq": list(range(10)), "value": [b"v"] * 10})
    store.put(store.join("a", "b"), b"bytes")
    store.write_table(store.join("t.parquet"), rows)
    assert store.read(store.join("a", "b")) == b"bytes"
    assert store.read_table(store.join("t.parquet")).equals(rows)
    assert store.list(store.join("a")) == ["b"]
    store.delete(store.join("a", "b"))
    store.delete(store.join("a", "b"))  # absent: no error
    with pytest.raises(FileNotFoundError):
        store.read(store.join("a", "b"))
    with pytest.raises(FileNotFoundError):
        Store.at("s3://no-such-bucket/x").read("no-such-bucket/x/y")
    metered.kill(0)
    with pytest.raises(OSError):  # the callers' "the store blipped" (e.g. the claim's renewal)
        store.put(store.join("a", "c"), b"bytes")
