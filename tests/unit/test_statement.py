"""Placed statements: a signature binds one record's place and payload, and nothing else."""

from __future__ import annotations

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.wire.statement import (
    PfcParts,
    decode_pfc,
    encode_placed_pfc,
    payload_digest,
    verify_statement,
)

KEY = Ed25519PrivateKey.generate()
PUBLIC = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
PLACE = ("orders", 3, 42, 7, 100, 0)
CERT = msgpack.packb([2, 42, 7, 10**13, PUBLIC, b"s" * 64])


def _pfc(*place: object, key: bytes | None = b"k", value: bytes | None = b"v") -> bytes:
    return encode_placed_pfc(CERT, KEY, *place, key, value)  # type: ignore[arg-type]


def test_a_statement_verifies_only_for_its_own_place_and_payload() -> None:
    parts = decode_pfc(_pfc(*PLACE))
    assert parts is not None and parts.version == 2 and parts.cert == CERT
    assert parts.signature is not None
    ok = payload_digest(b"k", b"v")
    assert verify_statement(PUBLIC, parts.signature, *PLACE, ok)
    topic, partition, pid, generation, seq, flags = PLACE
    elsewhere = [
        ("other", partition, pid, generation, seq, flags, ok),
        (topic, partition + 1, pid, generation, seq, flags, ok),
        (topic, partition, pid + 1, generation, seq, flags, ok),
        (topic, partition, pid, generation + 1, seq, flags, ok),
        (topic, partition, pid, generation, 2**62, flags, ok),
        (topic, partition, pid, generation, seq, 1, ok),
        (topic, partition, pid, generation, seq, flags, payload_digest(b"k", b"forged")),
    ]
    for place in elsewhere:
        assert not verify_statement(PUBLIC, parts.signature, *place)  # type: ignore[arg-type]
    other = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert not verify_statement(other, parts.signature, *PLACE, ok)


def test_none_and_empty_payloads_differ() -> None:
    assert payload_digest(None, b"") != payload_digest(b"", b"")
    assert payload_digest(b"ab", b"c") != payload_digest(b"a", b"bc")


def test_version_1_pfc_values_stay_readable() -> None:
    v1 = msgpack.packb([1, 42, 7, 10**13, b"s" * 64])
    assert decode_pfc(v1) == PfcParts(1, v1)


@pytest.mark.parametrize(
    "junk",
    [None, b"", b"\xc1", msgpack.packb([3, b"c", b"s" * 64]), msgpack.packb([2, b"c", b"short"]),
     msgpack.packb([2, "text", b"s" * 64]), msgpack.packb({"a": 1}), b"x" * 600, "str"],
)  # fmt: skip
def test_junk_is_none_never_an_exception(junk: object) -> None:
    assert decode_pfc(junk) is None
