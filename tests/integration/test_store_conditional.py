"""The store operations the sink relies on, on a real S3 store (SeaweedFS): create-if-absent is
atomic (racing writers, one winner), and Spark's checkpoint there reads like a local one."""

from __future__ import annotations

import threading

import pytest

from pidfence.spark_sink import s3_requests
from pidfence.spark_sink.storage import Store
from tests.fixtures.store import Bucket

pytestmark = [pytest.mark.integration]


def test_racing_creates_of_one_key_have_one_winner(s3_bucket: Bucket) -> None:
    store = Store.at(f"s3a://{s3_bucket.name}/race")
    s3_requests.probe(store.root, store.uri)  # the store honours If-None-Match
    for trial in range(5):
        key, wins, start = store.join(f"k{trial}"), [], threading.Barrier(8)

        def create(
            i: int, key: str = key, wins: list[int] = wins, start: threading.Barrier = start
        ) -> None:
            start.wait()
            if store.put_if_absent(key, str(i).encode()):
                wins.append(i)

        racers = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        assert len(wins) == 1, wins
        assert store.read(key) == str(wins[0]).encode()


def test_a_checkpoint_on_s3_gives_the_offsets_of_its_last_committed_batch(
    s3_bucket: Bucket,
) -> None:
    """What ``pidfence sink`` reads before Spark starts (the records Kafka deleted under the
    checkpoint, the progress total) comes from an ``s3a://`` checkpoint as from a local one."""
    from pidfence.spark_sink.spark_checkpoint import start_offsets

    checkpoint = f"s3a://{s3_bucket.name}/ckpt"
    store = Store.at(checkpoint)
    marks = {("t", 0): (5, 100), ("t", 1): (0, 50)}
    assert start_offsets(checkpoint, marks, "earliest") == {("t", 0): 5, ("t", 1): 0}
    meta = '{"batchWatermarkMs":0}'
    store.put(store.join("offsets", "0"), f'v1\n{meta}\n{{"t":{{"0":40,"1":20}}}}\n'.encode())
    store.put(store.join("offsets", "1"), f'v1\n{meta}\n{{"t":{{"0":90,"1":45}}}}\n'.encode())
    store.put(store.join("commits", "0"), b"v1\n{}\n")  # batch 1 planned, not committed
    assert start_offsets(checkpoint, marks, "earliest") == {("t", 0): 40, ("t", 1): 20}
