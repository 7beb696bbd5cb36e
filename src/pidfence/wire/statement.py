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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pidfence.wire.cert import CertCheck, load_public_keys, verify_cert

STATEMENT_VERSION: Final = 2
#: A placed ``pfc`` is a certificate (~140 bytes) plus a signature; anything far larger is junk.
MAX_PFC_BYTES: Final = 512
SIGNATURE_BYTES: Final = 64
PUBLIC_KEY_BYTES: Final = 32

#: A record's place, what a statement names: ``(topic, partition, pid, generation, seq,
#: flags)``, the topic and partition it is written to and its ``pf`` fields.
RecordPlace = tuple[str, int, int, int, int, int]


def statement_bytes(
    topic: str, partition: int, pid: int, generation: int, seq: int, flags: int
) -> bytes:
    """The exact bytes a producer signs for one record."""
    data: bytes = msgpack.packb(
        [STATEMENT_VERSION, topic, partition, pid, generation, seq, flags], use_bin_type=True
    )
    return data


def encode_placed_pfc(cert: bytes, producer_key: Ed25519PrivateKey, *place: *RecordPlace) -> bytes:
    """The ``pfc`` header value of one placed record: the certificate and the signed statement
    of its ``place`` (:data:`RecordPlace`)."""
    signature = producer_key.sign(statement_bytes(*place))
    data: bytes = msgpack.packb([STATEMENT_VERSION, cert, signature], use_bin_type=True)
    return data


@dataclass(frozen=True, slots=True)
class PfcParts:
    """A decoded ``pfc`` value: the lease certificate's bytes and the statement's signature."""

    cert: bytes
    signature: bytes


def decode_pfc(data: Any) -> PfcParts | None:
    """Split a ``pfc`` header value; None when it is not one (never raises)."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_PFC_BYTES:
        return None
    try:
        value = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception:  # noqa: BLE001 - msgpack raises many types for bad bytes
        return None
    if not isinstance(value, list) or not value or type(value[0]) is not int:
        return None
    if value[0] == STATEMENT_VERSION and len(value) == 3:
        _, cert, signature = value
        placed = isinstance(cert, bytes) and isinstance(signature, bytes)
        if placed and len(signature) == SIGNATURE_BYTES:
            return PfcParts(cert, signature)
    return None


def verify_statement(producer_public_key: bytes, signature: bytes, *place: *RecordPlace) -> bool:
    """Whether ``signature`` is the producer key's statement of exactly the record at ``place``
    (:data:`RecordPlace`)."""
    if len(producer_public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    public = Ed25519PublicKey.from_public_bytes(producer_public_key)
    try:
        public.verify(signature, statement_bytes(*place))
    except InvalidSignature:
        return False
    return True


#: Certificates, and statements, remembered by a :class:`PlacedCheck` (a live sink sees a few
#: per producer).
CACHE_SIZE: Final = 4096

K = TypeVar("K")
V = TypeVar("V")


def _remembered(cache: dict[K, V], key: K, compute: Callable[[], V]) -> V:
    """``cache[key]``, computed on a miss; the cache is emptied when it holds CACHE_SIZE."""
    value = cache.get(key)
    if value is None:
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        value = cache[key] = compute()
    return value


class PlacedCheck:
    """Verifies ``pfc`` headers against the lease servers' keys, for any (topic, partition).

    The broker rules ask for a proof only when a record would create an entry, move a generation
    or adopt a producer, so this runs rarely; each certificate's Ed25519 check is done once
    (cached), and each statement's once per (key, signature, place): a rebuild that replays the
    log asks about the same records again.

    Args:
        public_keys: the lease servers' public keys (several during a rotation).
    """

    def __init__(self, public_keys: Sequence[Ed25519PublicKey]) -> None:
        self._keys = list(public_keys)
        self._certs: dict[tuple[bytes, int, int], CertCheck] = {}
        self._statements: dict[tuple[bytes, bytes, RecordPlace], bool] = {}

    def reason(self, place: RecordPlace, pfc: bytes | None, now_ms: int) -> str | None:
        """None when ``pfc`` proves the record at ``place`` (:data:`RecordPlace`) at ``now_ms``,
        else why not: ``missing``, ``malformed``, ``unbound`` (a certificate naming no producer
        key), a certificate's reason (``other_identity``, ``unknown_key``, ``wrong_length``,
        ``expired``) or ``other_place`` (a genuine certificate whose statement names another
        topic, partition, seq or flags)."""
        if pfc is None:
            return "missing"
        parts = decode_pfc(pfc)
        if parts is None:
            return "malformed"
        _, _, pid, generation, _, _ = place
        cert = parts.cert
        # Checked at the earliest time: the answer at any time then follows from expire_ms.
        check = _remembered(
            self._certs,
            (cert, pid, generation),
            lambda: verify_cert(cert, self._keys, pid, generation, -(2**63)),
        )
        if not check.ok:
            return check.reason
        if check.expire_ms is not None and check.expire_ms <= now_ms:
            return "expired"
        if check.producer_key is None:
            return "unbound"
        key, signature = check.producer_key, parts.signature
        verify = partial(verify_statement, key, signature, *place)
        if not _remembered(self._statements, (key, signature, place), verify):
            return "other_place"
        return None

    def for_partition(
        self, topic: str, partition: int
    ) -> Callable[[int, int, int, int, bytes | None, int], str | None]:
        """The broker rules' verifier of one (topic, partition)."""

        def verify(
            pid: int, generation: int, seq: int, flags: int, pfc: bytes | None, now_ms: int
        ) -> str | None:
            return self.reason((topic, partition, pid, generation, seq, flags), pfc, now_ms)

        return verify


def placed_check(paths: Iterable[str | Path]) -> PlacedCheck:
    """A :class:`PlacedCheck` over the PEM public keys in ``paths``.

    Raises:
        KeyFileError: a file is missing or not an Ed25519 public key, or none given.
    """
    return PlacedCheck(load_public_keys(paths))


__all__ = [
    "PfcParts",
    "PlacedCheck",
    "RecordPlace",
    "decode_pfc",
    "encode_placed_pfc",
    "placed_check",
    "statement_bytes",
    "verify_statement",
]
