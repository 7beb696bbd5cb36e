"""Placed statements: what binds a lease certificate to one record on one (topic, partition).

DESIGN §3 (amended again). A lease certificate (:mod:`pidfence.wire.cert`, version 2) certifies a
per-lease producer key. The producer signs, with that key, a **statement** naming exactly where and
what the record is::

    msgpack [2, topic, partition, pid, generation, seq, flags]

The ``pfc`` header of a placed record is::

    msgpack [2, certificate (bin), signature (bin, 64 bytes)]

A copy of that header on another partition, topic or seq proves nothing: the signature covers
them. The payload is not covered: a topic writer who can copy a placed record can also write
records inside a live generation without any header, which only the per-record MAC mode stops.
Version 1 ``pfc`` values (the bare version 1 certificate) stay decodable; they bind nothing
beyond (pid, generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

STATEMENT_VERSION: Final = 2
#: A placed ``pfc`` is a certificate (~140 bytes) plus a signature; anything far larger is junk.
MAX_PFC_BYTES: Final = 512
SIGNATURE_BYTES: Final = 64
PUBLIC_KEY_BYTES: Final = 32


def statement_bytes(
    topic: str, partition: int, pid: int, generation: int, seq: int, flags: int
) -> bytes:
    """The exact bytes a producer signs for one record."""
    data: bytes = msgpack.packb(
        [STATEMENT_VERSION, topic, partition, pid, generation, seq, flags], use_bin_type=True
    )
    return data


def encode_placed_pfc(
    cert: bytes,
    producer_key: Ed25519PrivateKey,
    topic: str,
    partition: int,
    pid: int,
    generation: int,
    seq: int,
    flags: int,
) -> bytes:
    """The ``pfc`` header value of one placed record: the certificate and the signed statement."""
    signature = producer_key.sign(statement_bytes(topic, partition, pid, generation, seq, flags))
    data: bytes = msgpack.packb([STATEMENT_VERSION, cert, signature], use_bin_type=True)
    return data


@dataclass(frozen=True, slots=True)
class PfcParts:
    """A decoded ``pfc`` value.

    Attributes:
        version: 1 (a bare version 1 certificate) or 2 (certificate + statement signature).
        cert: the lease certificate's bytes.
        signature: the statement's signature (version 2), else None.
    """

    version: int
    cert: bytes
    signature: bytes | None = None


def decode_pfc(data: Any) -> PfcParts | None:
    """Split a ``pfc`` header value; None when it is neither version (never raises)."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_PFC_BYTES:
        return None
    try:
        value = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception:  # noqa: BLE001 - msgpack raises many types for bad bytes
        return None
    if not isinstance(value, list) or not value or type(value[0]) is not int:
        return None
    if value[0] == 1 and len(value) == 5:
        return PfcParts(1, bytes(data))
    if value[0] == STATEMENT_VERSION and len(value) == 3:
        _, cert, signature = value
        placed = isinstance(cert, bytes) and isinstance(signature, bytes)
        if placed and len(signature) == SIGNATURE_BYTES:
            return PfcParts(STATEMENT_VERSION, cert, signature)
    return None


def verify_statement(
    producer_public_key: bytes,
    signature: bytes,
    topic: str,
    partition: int,
    pid: int,
    generation: int,
    seq: int,
    flags: int,
) -> bool:
    """Whether ``signature`` is the producer key's statement of exactly this record."""
    if len(producer_public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    public = Ed25519PublicKey.from_public_bytes(producer_public_key)
    try:
        public.verify(signature, statement_bytes(topic, partition, pid, generation, seq, flags))
    except InvalidSignature:
        return False
    return True


__all__ = [
    "PfcParts",
    "decode_pfc",
    "encode_placed_pfc",
    "statement_bytes",
    "verify_statement",
]
