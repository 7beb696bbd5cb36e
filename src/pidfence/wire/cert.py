"""Lease certificates: the lease server's Ed25519 signature over a lease (DESIGN.md §3 amended).

Two versions, both decodable:

* v1 = msgpack ``[1, pid, generation, expire_ms, signature]``, ``signature`` Ed25519 over msgpack
  ``[1, pid, generation, expire_ms]``: what a server signs when the request names no producer key.
* v2 = msgpack ``[2, pid, generation, expire_ms, key, signature]``, ``signature`` Ed25519 over
  msgpack ``[2, pid, generation, expire_ms, key]``: ``key`` is the producer's own raw Ed25519
  public key (32 bytes) for this lease, sent in the ``lease``, ``bump`` or ``roll`` request. The
  lease server vouches that whoever holds that key's private half holds this lease, so the producer
  can sign statements naming a topic and partition that a copier cannot move elsewhere.

The lease server puts ``cert`` in every lease, bump and roll reply when it runs with
``--signing-key``; producers carry it inside the ``pfc`` header, a placed statement
``[2, cert, signature]`` (:mod:`~pidfence.wire.statement`); the sink verifies it with
:func:`verify_cert` against one or more public keys (several during a key rotation).

Key files live here too: the signing key pair (PEM) and the helpers that read and create private
files (``pidfence.wire.mac`` reads its secret with them).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pidfence.wire.errors import PidfenceError

CERT_VERSION = 1
#: The version of a certificate that names a producer key.
CERT_VERSION_KEYED = 2
CERT_HEADER_KEY = "pfc"
SIGNATURE_BYTES = 64
#: A raw Ed25519 public key: what a v2 certificate names and a ``key`` request field carries.
PRODUCER_KEY_BYTES = 32
#: A v2 cert is ~125 bytes; anything far larger is refused before msgpack looks at it.
MAX_CERT_BYTES = 256

CertReason = Literal["ok", "malformed", "wrong_length", "other_identity", "expired", "unknown_key"]


class KeyFileError(PidfenceError):
    """A signing key, public key or secret file is missing, unreadable, unsafe or malformed."""


class InvalidProducerKey(PidfenceError, ValueError):
    """A producer key that is not a raw Ed25519 public key (32 bytes)."""


class KeyFileExists(KeyFileError):
    """A key or secret file to be created exists already (keys are never overwritten)."""


@dataclass(frozen=True, slots=True)
class CertCheck:
    """The outcome of :func:`verify_cert`.

    Attributes:
        ok: True only for a well-formed, unexpired cert of the asked identity signed by a known
            key.
        reason: ``"ok"`` or why not: ``malformed`` (not msgpack / wrong types / version),
            ``wrong_length`` (array, key or signature length), ``other_identity`` (another pid or
            generation), ``expired``, ``unknown_key`` (no given key verifies the signature).
        expire_ms: the cert's lease end when it could be read, else None.
        version: 1 or 2 when the cert could be read, else None.
        producer_key: the raw producer public key a v2 cert names (None for v1 or unreadable).
    """

    ok: bool
    reason: CertReason
    expire_ms: int | None = None
    version: int | None = None
    producer_key: bytes | None = None


def _signed_fields(pid: int, generation: int, expire_ms: int, key: bytes | None) -> list[Any]:
    if key is None:
        return [CERT_VERSION, pid, generation, expire_ms]
    return [CERT_VERSION_KEYED, pid, generation, expire_ms, key]


def _signed_part(pid: int, generation: int, expire_ms: int, producer_key: bytes | None) -> bytes:
    data: bytes = msgpack.packb(_signed_fields(pid, generation, expire_ms, producer_key))
    return data


def encode_cert(
    private_key: Ed25519PrivateKey,
    pid: int,
    generation: int,
    expire_ms: int,
    producer_key: bytes | None = None,
) -> bytes:
    """The signed cert of ``(pid, generation, expire_ms)``: v1, or v2 naming ``producer_key``.

    Args:
        private_key: the lease server's signing key.
        pid: the lease's pid.
        generation: its generation.
        expire_ms: its end (epoch ms).
        producer_key: the producer's raw Ed25519 public key (32 bytes) for a v2 cert.

    Raises:
        InvalidProducerKey: ``producer_key`` is not 32 bytes.
    """
    if producer_key is not None and (
        type(producer_key) is not bytes or len(producer_key) != PRODUCER_KEY_BYTES
    ):
        raise InvalidProducerKey(
            f"a producer key is a raw Ed25519 public key of {PRODUCER_KEY_BYTES} bytes"
        )
    fields = _signed_fields(pid, generation, expire_ms, producer_key)
    signature = private_key.sign(msgpack.packb(fields))
    data: bytes = msgpack.packb([*fields, signature])
    return data


@dataclass(frozen=True, slots=True)
class _Fields:
    version: int
    pid: int
    generation: int
    expire_ms: int
    producer_key: bytes | None
    signature: bytes


def _fields(data: Any) -> tuple[CertReason, _Fields | None]:
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_CERT_BYTES:
        return "malformed", None
    try:
        value = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception:  # noqa: BLE001 - msgpack raises many types for bad bytes
        return "malformed", None
    if not isinstance(value, list) or not value:
        return "malformed", None
    version = value[0]
    if type(version) is not int or version not in (CERT_VERSION, CERT_VERSION_KEYED):
        return "malformed", None
    if len(value) != (5 if version == CERT_VERSION else 6):
        return "wrong_length", None
    pid, generation, expire_ms = value[1:4]
    producer_key = value[4] if version == CERT_VERSION_KEYED else None
    signature = value[-1]
    if not all(type(v) is int for v in (pid, generation, expire_ms)):
        return "malformed", None
    if not isinstance(signature, bytes) or (
        version == CERT_VERSION_KEYED and not isinstance(producer_key, bytes)
    ):
        return "malformed", None
    if len(signature) != SIGNATURE_BYTES or (
        producer_key is not None and len(producer_key) != PRODUCER_KEY_BYTES
    ):
        return "wrong_length", None
    return "ok", _Fields(version, pid, generation, expire_ms, producer_key, signature)


def cert_producer_key(data: Any) -> bytes | None:
    """The producer key a version 2 cert names (None for v1 or anything unreadable); the
    signature is not checked (a producer reads its own lease's cert with it)."""
    reason, fields = _fields(data)
    return fields.producer_key if fields is not None and reason == "ok" else None


def verify_cert(
    data: bytes | None,
    public_keys: Sequence[Ed25519PublicKey],
    pid: int,
    generation: int,
    now_ms: int,
) -> CertCheck:
    """Check that ``data`` is a valid cert (v1 or v2) for ``(pid, generation)`` at ``now_ms``.

    Never raises for bad input: the reason says what is wrong. A v2 cert's ``producer_key`` is
    returned for the caller to check the producer's own signatures with.
    """
    if data is None:
        return CertCheck(False, "malformed")
    reason, cert = _fields(data)
    if cert is None:
        return CertCheck(False, reason)
    version, expire_ms, producer_key = cert.version, cert.expire_ms, cert.producer_key
    if cert.pid != pid or cert.generation != generation:
        return CertCheck(False, "other_identity", expire_ms, version, producer_key)
    signed = _signed_part(cert.pid, cert.generation, expire_ms, producer_key)
    for key in public_keys:
        try:
            key.verify(cert.signature, signed)
        except InvalidSignature:
            continue
        if expire_ms <= now_ms:
            return CertCheck(False, "expired", expire_ms, version, producer_key)
        return CertCheck(True, "ok", expire_ms, version, producer_key)
    return CertCheck(False, "unknown_key", expire_ms, version, producer_key)


def read_private_file(path: str | Path, what: str) -> bytes:
    """The bytes of a secret file, refused when its mode lets group or others read or write it.

    Raises:
        KeyFileError: missing, unreadable, or readable by others (the message says ``chmod 600``).
    """
    try:
        mode = Path(path).stat().st_mode
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{what} {path} is readable by others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
        )
    return data


def create_private_file(path: str | Path, data: bytes, what: str) -> Path:
    """Write ``data`` to a new file of mode 0600 (``O_EXCL``: never overwrites, never readable by
    others, not even briefly); a failed write leaves no file behind.

    Raises:
        KeyFileError: the file exists, or its folder cannot be written.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileExists(
            f"{target} exists; {what} files are never overwritten (rotate into a new file)"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot write {what} {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise KeyFileError(f"cannot write {what} {target}: {exc.strerror or exc}") from None
    return target


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read an Ed25519 private key (PEM, unencrypted).

    Raises:
        KeyFileError: missing, unreadable or not an Ed25519 private key.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read signing key {path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"{path} holds a {type(key).__name__}, not Ed25519; make one with "
            "`pidfence keys generate DIR`"
        )
    return key


def load_public_keys(paths: Iterable[str | Path]) -> list[Ed25519PublicKey]:
    """Read Ed25519 public keys (PEM); several for key rotation.

    Raises:
        KeyFileError: a file is missing, unreadable or not an Ed25519 public key, or none given.
    """
    keys: list[Ed25519PublicKey] = []
    for path in paths:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise KeyFileError(f"cannot read public key {path}: {exc.strerror or exc}") from None
        try:
            key = serialization.load_pem_public_key(raw)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{path} is not a PEM public key: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
        keys.append(key)
    if not keys:
        raise KeyFileError("no public key given; name one or more PEM files")
    return keys


def generate_keypair(directory: str | Path) -> tuple[Path, Path]:
    """Write ``DIR/lease-signing.key`` (mode 0600) and ``DIR/lease-signing.pub``.

    Refuses to overwrite an existing private key (a rotation writes to a new directory).

    Raises:
        KeyFileError: the directory cannot be written or the key already exists.
    """
    folder = Path(directory)
    private_path = folder / "lease-signing.key"
    public_path = folder / "lease-signing.pub"
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    create_private_file(private_path, private_pem, "signing key")
    try:
        public_path.write_bytes(public_pem)
    except OSError as exc:
        private_path.unlink(missing_ok=True)
        raise KeyFileError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    return private_path, public_path
