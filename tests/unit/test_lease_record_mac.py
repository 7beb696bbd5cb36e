"""Per-record MAC keys and MACs (``pidfence.wire.mac``): what the lease server hands out with
``--record-mac-secret`` and what producers and the sink compute (issue 22, per-record mode)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.wire import mac as wire_mac
from pidfence.wire.cert import KeyFileError

SECRET = bytes(range(32))
RECORD = ("orders", 3, 5, 9, 41, 0, b"k", b"value")


def test_record_keys_are_per_pid_and_per_secret() -> None:
    key = wire_mac.derive_record_key(SECRET, 5)
    assert len(key) == 32
    assert key == wire_mac.derive_record_key(SECRET, 5)
    others = {wire_mac.derive_record_key(SECRET, 6), wire_mac.derive_record_key(bytes(32), 5)}
    assert key not in others and len(others) == 2


@pytest.mark.parametrize(
    "changed",
    [
        ("orders2", 3, 5, 9, 41, 0, b"k", b"value"),  # another topic
        ("orders", 4, 5, 9, 41, 0, b"k", b"value"),  # another partition
        ("orders", 3, 5, 10, 41, 0, b"k", b"value"),  # another generation of the pid
        ("orders", 3, 5, 9, 42, 0, b"k", b"value"),  # another seq
        ("orders", 3, 5, 9, 41, 1, b"k", b"value"),  # flags
        ("orders", 3, 5, 9, 41, 0, b"j", b"value"),  # another key of the same length
        ("orders", 3, 5, 9, 41, 0, b"k", b"valuf"),  # another value of the same length
        ("orders", 3, 5, 9, 41, 0, b"kv", b"alue"),  # the key/value split moved
        ("orders", 3, 5, 9, 41, 0, None, b"value"),  # no key instead of a key
        ("orders", 3, 5, 9, 41, 0, b"k", b""),  # empty value
        ("orders", 3, 5, 9, 41, 0, b"k", None),  # a tombstone
    ],
)
def test_a_mac_covers_where_the_record_goes_and_what_it_holds(changed: tuple) -> None:  # type: ignore[type-arg]
    key = wire_mac.derive_record_key(SECRET, 5)
    mac = wire_mac.record_mac(key, *RECORD)
    assert len(mac) == wire_mac.RECORD_MAC_BYTES
    assert wire_mac.check_record_mac(key, *RECORD, mac)
    assert not wire_mac.check_record_mac(key, *changed, mac)
    assert not wire_mac.check_record_mac(wire_mac.derive_record_key(SECRET, 6), *RECORD, mac)
    assert not wire_mac.check_record_mac(key, *RECORD, mac[:-1])
    assert not wire_mac.check_record_mac(key, *RECORD, None)


@pytest.mark.parametrize("at", [0, 7, 8, wire_mac.RECORD_MAC_BYTES - 1])
def test_every_byte_of_a_mac_counts(at: int) -> None:
    """A MAC wrong in any one byte is refused, by the producer's check and the sink's."""
    mac = wire_mac.record_mac(wire_mac.derive_record_key(SECRET, 5), *RECORD)
    wrong = bytearray(mac)
    wrong[at] ^= 0x01
    assert not wire_mac.check_record_mac(
        wire_mac.derive_record_key(SECRET, 5), *RECORD, bytes(wrong)
    )
    assert not wire_mac.RecordMacCheck(SECRET).valid(*RECORD, bytes(wrong))
    assert wire_mac.RecordMacCheck(SECRET).valid(*RECORD, mac)


def test_the_sink_check_derives_the_same_keys() -> None:
    check = wire_mac.RecordMacCheck(SECRET, cache=1)
    mac = wire_mac.record_mac(wire_mac.derive_record_key(SECRET, 5), *RECORD)
    other = ("orders", 3, 6, 1, 0, 0, b"k", b"v")
    other_mac = wire_mac.record_mac(wire_mac.derive_record_key(SECRET, 6), *other)
    # Twice each, through a one-entry cache: evicted keys are derived again.
    for _ in range(2):
        assert check.valid(*RECORD, mac)
        assert check.valid(*other, other_mac)
    assert not check.valid(*RECORD, other_mac)
    assert not check.valid(*RECORD, None)
    with pytest.raises(ValueError, match="32 bytes"):
        wire_mac.RecordMacCheck(b"short")


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=2000),
)
def test_the_keyed_state_gives_the_same_mac(
    topic: str, partition: int, seq: int, key: bytes | None, value: bytes | None
) -> None:
    record_key = wire_mac.derive_record_key(SECRET, 1)
    hasher = wire_mac.record_hasher(record_key)
    first = wire_mac.record_mac_from(hasher, topic, partition, 1, 2, seq, 0, key, value)
    assert first == wire_mac.record_mac(record_key, topic, partition, 1, 2, seq, 0, key, value)
    assert wire_mac.record_mac_from(hasher, topic, partition, 1, 2, seq, 0, key, value) == first


def test_secret_files_are_private_hex_and_never_overwritten(tmp_path: Path) -> None:
    path = wire_mac.generate_mac_secret(tmp_path / "record-mac.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = wire_mac.load_mac_secret(path)
    assert len(secret) == 32
    with pytest.raises(KeyFileError, match="never overwritten"):
        wire_mac.generate_mac_secret(path)
    path.chmod(0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        wire_mac.load_mac_secret(path)
    short = tmp_path / "short"
    short.write_text("abcd\n")
    short.chmod(0o600)
    with pytest.raises(KeyFileError, match="64 hex digits"):
        wire_mac.load_mac_secret(short)
    with pytest.raises(KeyFileError, match="cannot read"):
        wire_mac.load_mac_secret(tmp_path / "missing")
