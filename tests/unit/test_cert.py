"""``pidfence.wire.cert``: lease certificates, every bad-input reason, key files, key rotation."""

from __future__ import annotations

import stat
from pathlib import Path

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from pidfence.wire import cert as wire_cert

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
PUBLIC = [KEY.public_key()]


def test_valid_cert_verifies_and_reports_its_expiry() -> None:
    cert = wire_cert.encode_cert(KEY, 7, 100, 5_000)
    check = wire_cert.verify_cert(cert, PUBLIC, 7, 100, 4_999)
    assert (check.ok, check.reason, check.expire_ms) == (True, "ok", 5_000)
    assert len(cert) < 100


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "malformed"),
        (b"", "malformed"),
        (b"\xc1", "malformed"),
        (msgpack.packb({"v": 1}), "malformed"),
        (msgpack.packb([1, 7, 100, 5_000]), "wrong_length"),
        (msgpack.packb([1, 7, 100, 5_000, b"s" * 64, 0]), "wrong_length"),
        (msgpack.packb([1, 7, 100, 5_000, b"s" * 63]), "wrong_length"),
        (msgpack.packb([2, 7, 100, 5_000, b"s" * 64]), "wrong_length"),  # v2 has six fields
        (msgpack.packb([2, 7, 100, 5_000, b"k" * 31, b"s" * 64]), "wrong_length"),
        (msgpack.packb([2, 7, 100, 5_000, "k" * 32, b"s" * 64]), "malformed"),
        (msgpack.packb([3, 7, 100, 5_000, b"s" * 64]), "malformed"),
        (msgpack.packb([1, "7", 100, 5_000, b"s" * 64]), "malformed"),
        (msgpack.packb([1, 7, 100, 5_000, "s" * 64]), "malformed"),
        (b"\x00" * 300, "malformed"),
        # Over MAX_CERT_BYTES: refused by its size before msgpack reads it, whatever it holds.
        (msgpack.packb([1, 7, 100, 5_000, b"s" * wire_cert.MAX_CERT_BYTES]), "malformed"),
        (wire_cert.encode_cert(KEY, 8, 100, 5_000), "other_identity"),
        (wire_cert.encode_cert(KEY, 7, 101, 5_000), "other_identity"),
        (wire_cert.encode_cert(KEY, 7, 100, 4_000), "expired"),
        (wire_cert.encode_cert(OTHER, 7, 100, 5_000), "unknown_key"),
    ],
)
def test_every_bad_cert_has_its_reason(data: bytes | None, reason: str) -> None:
    check = wire_cert.verify_cert(data, PUBLIC, 7, 100, 4_500)
    assert (check.ok, check.reason) == (False, reason)


def test_a_tampered_expiry_is_an_unknown_key() -> None:
    fields = msgpack.unpackb(wire_cert.encode_cert(KEY, 7, 100, 5_000))
    fields[3] = 10**12  # extend the lease without the key
    assert wire_cert.verify_cert(msgpack.packb(fields), PUBLIC, 7, 100, 0).reason == "unknown_key"


def test_rotation_accepts_any_listed_key() -> None:
    both = [OTHER.public_key(), KEY.public_key()]
    assert wire_cert.verify_cert(wire_cert.encode_cert(KEY, 7, 1, 9), both, 7, 1, 0).ok
    assert wire_cert.verify_cert(wire_cert.encode_cert(OTHER, 7, 1, 9), both, 7, 1, 0).ok


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_and_never_verify(data: bytes) -> None:
    check = wire_cert.verify_cert(data, PUBLIC, 7, 100, 0)
    assert not check.ok


@given(
    st.integers(1, 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.integers(1, 2**62),
    st.integers(0, 2**62),
)
def test_signed_identity_round_trips(pid: int, generation: int, expire: int, now: int) -> None:
    check = wire_cert.verify_cert(
        wire_cert.encode_cert(KEY, pid, generation, expire), PUBLIC, pid, generation, now
    )
    assert check.ok == (now < expire)
    assert check.reason == ("ok" if now < expire else "expired")


def test_generate_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    private, public = wire_cert.generate_keypair(tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = wire_cert.load_private_key(private)
    [pub] = wire_cert.load_public_keys([public])
    assert wire_cert.verify_cert(wire_cert.encode_cert(key, 1, 2, 3), [pub], 1, 2, 0).ok
    with pytest.raises(wire_cert.KeyFileError, match="never overwritten"):
        wire_cert.generate_keypair(tmp_path / "keys")


def test_bad_key_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(wire_cert.KeyFileError, match="cannot read"):
        wire_cert.load_private_key(tmp_path / "missing.key")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    with pytest.raises(wire_cert.KeyFileError, match="not an unencrypted PEM"):
        wire_cert.load_private_key(junk)
    with pytest.raises(wire_cert.KeyFileError, match="not a PEM public key"):
        wire_cert.load_public_keys([junk])
    with pytest.raises(wire_cert.KeyFileError, match="no public key"):
        wire_cert.load_public_keys([])


# -- version 2: a certificate naming the producer's key -----------------------------------------

PRODUCER = Ed25519PrivateKey.generate().public_key().public_bytes_raw()


def test_a_v2_cert_names_the_producer_key_and_verifies() -> None:
    cert = wire_cert.encode_cert(KEY, 7, 100, 5_000, PRODUCER)
    assert msgpack.unpackb(cert)[:5] == [2, 7, 100, 5_000, PRODUCER]
    check = wire_cert.verify_cert(cert, PUBLIC, 7, 100, 4_999)
    assert (check.ok, check.version, check.producer_key, check.expire_ms) == (
        True,
        2,
        PRODUCER,
        5_000,
    )
    v1 = wire_cert.verify_cert(wire_cert.encode_cert(KEY, 7, 100, 5_000), PUBLIC, 7, 100, 0)
    assert (v1.ok, v1.version, v1.producer_key) == (True, 1, None)


def test_the_producer_key_is_under_the_signature() -> None:
    fields = msgpack.unpackb(wire_cert.encode_cert(KEY, 7, 100, 5_000, PRODUCER))
    fields[4] = bytes(32)  # another producer's key, the server's signature kept
    check = wire_cert.verify_cert(msgpack.packb(fields), PUBLIC, 7, 100, 0)
    assert (check.ok, check.reason) == (False, "unknown_key")
    stripped = msgpack.packb([1, *fields[1:4], fields[5]])  # passed off as a v1 cert
    assert wire_cert.verify_cert(stripped, PUBLIC, 7, 100, 0).reason == "unknown_key"
    assert wire_cert.verify_cert(
        wire_cert.encode_cert(KEY, 7, 100, 5_000, PRODUCER), PUBLIC, 7, 100, 5_000
    ).reason == ("expired")


@pytest.mark.parametrize("bad", [b"k" * 31, b"k" * 33, "k" * 32])
def test_encode_refuses_a_producer_key_that_is_not_32_bytes(bad: object) -> None:
    from pidfence.wire.cert import InvalidProducerKey

    with pytest.raises(InvalidProducerKey, match="32 bytes"):
        wire_cert.encode_cert(KEY, 7, 100, 5_000, bad)  # type: ignore[arg-type]
