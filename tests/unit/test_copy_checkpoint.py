"""The copy group's committed checkpoint: the offset commit's metadata string, clear or sealed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidfence.producer import BadCheckpoint, ProducerCheckpoint, ProducerConfigError
from pidfence.producer.copy_checkpoint import METADATA_LIMIT, GroupKey, MetadataCodec

LONGEST = "t" * 249  # Kafka's longest topic name


def _checkpoint(topic: str, partition: int = 3) -> ProducerCheckpoint:
    """A task checkpoint with every per-partition field and a MAC key: the largest kind."""
    tp = (topic, partition)
    return ProducerCheckpoint(
        pid=2**62,
        generation=2**31 - 1,
        expire_ms=2**45,
        next_seq={tp: 2**40},
        lifetime_ms=86_400_000,
        secret=os.urandom(28),
        skip={tp: 17},
        taken_ms=2**45,
        ahead={tp: 2**40 + 5},
        topics=(topic,),
        mac_key=os.urandom(32),
        fenced={tp: 2**31 - 1},
        sticky_seed=2**62 - 1,  # after a rollover: the lineage's first pid
    )


def _key() -> GroupKey:
    return GroupKey(os.urandom(32))


@pytest.mark.parametrize("sealed", [False, True])
def test_the_checkpoint_round_trips_and_fits_kafkas_default_limit(sealed: bool) -> None:
    codec = MetadataCodec("g", "in", LONGEST, _key() if sealed else None)
    checkpoint = _checkpoint(LONGEST)
    text = codec.encode(3, checkpoint)
    # The figures docs/producer.md states: 1,954 bytes clear, 2,649 sealed (base64 of AES-GCM).
    assert len(text.encode()) <= (2649 if sealed else 1954) < METADATA_LIMIT
    assert codec.decode(3, text) == checkpoint


def test_a_sealed_checkpoint_opens_only_with_its_key_for_its_group_and_partition() -> None:
    key = _key()
    text = MetadataCodec("g", "in", "out", key).encode(1, _checkpoint("out", 1))
    assert "secret" not in text
    refusals = [
        (MetadataCodec("g", "in", "out"), 1, "give --group-key"),
        (MetadataCodec("g", "in", "out", _key()), 1, "does not open"),
        (MetadataCodec("g", "in", "out", key), 2, "does not open"),  # moved to another partition
        (MetadataCodec("h", "in", "out", key), 1, "does not open"),  # another group
    ]
    for codec, partition, reason in refusals:
        with pytest.raises(BadCheckpoint, match=reason):
            codec.decode(partition, text)


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        (None, "carries no copier checkpoint"),
        ("", "carries no copier checkpoint"),
        ("some other consumer's note", "carries no copier checkpoint"),
        ('{"v": 2, "to": "out", "cp": {}}', "carries no copier checkpoint"),
        ('{"v": 1, "to": "elsewhere", "cp": {}}', "copies to 'elsewhere'"),
    ],
)
def test_a_commit_that_is_not_this_groups_checkpoint_is_refused(
    metadata: str | None, reason: str
) -> None:
    with pytest.raises(BadCheckpoint, match=reason):
        MetadataCodec("g", "in", "out").decode(0, metadata)


def test_a_clear_checkpoint_is_refused_when_the_group_is_sealed() -> None:
    text = MetadataCodec("g", "in", "out").encode(0, _checkpoint("out", 0))
    with pytest.raises(BadCheckpoint, match="not sealed"):
        MetadataCodec("g", "in", "out", _key()).decode(0, text)


def test_a_checkpoint_over_the_limit_is_refused_before_the_commit() -> None:
    topics = tuple(f"{LONGEST[:-3]}{i:03}" for i in range(20))
    big = ProducerCheckpoint(1, 1, 1, {(t, 0): 1 for t in topics}, topics=topics)
    with pytest.raises(BadCheckpoint, match=r"offset\.metadata\.max\.bytes"):
        MetadataCodec("g", "in", "out").encode(0, big)


def test_the_group_key_is_64_hex_digits_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "group.key"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o644)
    with pytest.raises(ProducerConfigError, match="chmod 600"):
        GroupKey.load(path)
    path.chmod(0o600)
    assert len(GroupKey.load(path).key) == 32
    path.write_text("abcd\n")
    with pytest.raises(ProducerConfigError, match="64 hex digits"):
        GroupKey.load(path)
    assert "key=" not in repr(GroupKey(b"k" * 32))
