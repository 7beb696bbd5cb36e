"""Placed statements: a signature binds one record's place and payload, and nothing else."""

from __future__ import annotations

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pidfence.wire.statement import decode_pfc, encode_placed_pfc, verify_statement

KEY = Ed25519PrivateKey.generate()
PUBLIC = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
PLACE = ("orders", 3, 42, 7, 100, 0)
CERT = msgpack.packb([2, 42, 7, 10**13, PUBLIC, b"s" * 64])


def _pfc(*place: object) -> bytes:
    return encode_placed_pfc(CERT, KEY, *place)  # type: ignore[arg-type]


def test_a_statement_verifies_only_for_its_own_place() -> None:
    parts = decode_pfc(_pfc(*PLACE))
    assert parts is not None and parts.cert == CERT
    assert verify_statement(PUBLIC, parts.signature, *PLACE)
    topic, partition, pid, generation, seq, flags = PLACE
    elsewhere = [
        ("other", partition, pid, generation, seq, flags),
        (topic, partition + 1, pid, generation, seq, flags),
        (topic, partition, pid + 1, generation, seq, flags),
        (topic, partition, pid, generation + 1, seq, flags),
        (topic, partition, pid, generation, 2**62, flags),
        (topic, partition, pid, generation, seq, 1),
    ]
    for place in elsewhere:
        assert not verify_statement(PUBLIC, parts.signature, *place)  # type: ignore[arg-type]
    other = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert not verify_statement(other, parts.signature, *PLACE)


@pytest.mark.parametrize(
    "junk",
    [
        None,
        b"",
        b"\xc1",
        msgpack.packb([3, b"c", b"s" * 64]),
        msgpack.packb([1, 42, 7, 10**13, b"s" * 64]),  # a bare certificate binds no place
        msgpack.packb([2, b"c", b"short"]),
        msgpack.packb([*msgpack.unpackb(_pfc(*PLACE)), b"x"]),  # a good pfc, one element more
        msgpack.packb([2, "text", b"s" * 64]),
        msgpack.packb({"a": 1}),
        b"x" * 600,
        "str",
    ],
)
def test_junk_is_none_never_an_exception(junk: object) -> None:
    assert decode_pfc(junk) is None
