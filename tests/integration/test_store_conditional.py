"""Create-if-absent on a real S3 store (SeaweedFS) is atomic: racing writers, one winner."""

from __future__ import annotations

import threading

import pytest

from pidfence.spark_sink import conditional
from pidfence.spark_sink.storage import Store
from tests.fixtures.store import Bucket

pytestmark = [pytest.mark.integration]


def test_racing_creates_of_one_key_have_one_winner(s3_bucket: Bucket) -> None:
    store = Store.at(f"s3a://{s3_bucket.name}/race")
    conditional.probe(store.root, store.uri)  # the store honours If-None-Match
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
