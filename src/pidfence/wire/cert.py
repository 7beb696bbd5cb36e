"""Lease certificates: the lease server's Ed25519 signature over (pid, generation, expire_ms).

DESIGN.md §3 amended. ``cert`` = msgpack ``[1, pid, generation, expire_ms, signature]``, where
``signature`` is Ed25519 over msgpack ``[1, pid, generation, expire_ms]``. The lease server puts
it in every lease, bump and roll reply when it runs with ``--signing-key``; producers stamp it as
the ``pfc`` header; the sink verifies it with :func:`verify_cert` against one or more public keys
(several during a key rotation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pidfence.wire.errors import PidfenceError

CERT_VERSION = 1
CERT_HEADER_KEY = "pfc"
SIGNATURE_BYTES = 64
#: A cert is ~90 bytes; anything far larger is refused before msgpack looks at it.
MAX_CERT_BYTES = 256

CertReason = Literal["ok", "malformed", "wrong_length", "other_identity", "expired", "unknown_key"]


class KeyFileError(PidfenceError):
    """A signing or public key file is missing, unreadable or not an Ed25519 PEM key."""


@dataclass(frozen=True, slots=True)
class CertCheck:
    """The outcome of :func:`verify_cert`.

    Attributes:
        ok: True only for a well-formed, unexpired cert of the asked identity signed by a known
            key.
        reason: ``"ok"`` or why not: ``malformed`` (not msgpack / wrong types / version),
            ``wrong_length`` (array or signature length), ``other_identity`` (another pid or
            generation), ``expired``, ``unknown_key`` (no given key verifies the signature).
        expire_ms: the cert's lease end when it could be read, else None.
    """

    ok: bool
    reason: CertReason
    expire_ms: int | None = None


def _signed_part(pid: int, generation: int, expire_ms: int) -> bytes:
    data: bytes = msgpack.packb([CERT_VERSION, pid, generation, expire_ms], use_bin_type=True)
    return data


def encode_cert(private_key: Ed25519PrivateKey, pid: int, generation: int, expire_ms: int) -> bytes:
    """The signed cert of ``(pid, generation, expire_ms)``."""
    signature = private_key.sign(_signed_part(pid, generation, expire_ms))
    data: bytes = msgpack.packb(
        [CERT_VERSION, pid, generation, expire_ms, signature], use_bin_type=True
    )
    return data


def _fields(data: Any) -> tuple[CertReason, tuple[int, int, int, bytes] | None]:
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_CERT_BYTES:
        return "malformed", None
    try:
        value = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception:  # noqa: BLE001 - msgpack raises many types for bad bytes
        return "malformed", None
    if not isinstance(value, list):
        return "malformed", None
    if len(value) != 5:
        return "wrong_length", None
    version, pid, generation, expire_ms, signature = value
    if version != CERT_VERSION or type(version) is not int:
        return "malformed", None
    if not all(type(v) is int for v in (pid, generation, expire_ms)):
        return "malformed", None
    if not isinstance(signature, bytes):
        return "malformed", None
    if len(signature) != SIGNATURE_BYTES:
        return "wrong_length", None
    return "ok", (pid, generation, expire_ms, signature)


def verify_cert(
    data: bytes | None,
    public_keys: Sequence[Ed25519PublicKey],
    pid: int,
    generation: int,
    now_ms: int,
) -> CertCheck:
    """Check that ``data`` is a valid cert for ``(pid, generation)`` at ``now_ms``.

    Never raises for bad input: the reason says what is wrong.
    """
    if data is None:
        return CertCheck(False, "malformed")
    reason, fields = _fields(data)
    if fields is None:
        return CertCheck(False, reason)
    cert_pid, cert_generation, expire_ms, signature = fields
    if cert_pid != pid or cert_generation != generation:
        return CertCheck(False, "other_identity", expire_ms)
    signed = _signed_part(cert_pid, cert_generation, expire_ms)
    for key in public_keys:
        try:
            key.verify(signature, signed)
        except InvalidSignature:
            continue
        if expire_ms <= now_ms:
            return CertCheck(False, "expired", expire_ms)
        return CertCheck(True, "ok", expire_ms)
    return CertCheck(False, "unknown_key", expire_ms)


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


def cert_verifier(
    paths: Iterable[str | Path],
) -> Callable[[int, int, bytes | None, int], str | None]:
    """``verify(pid, generation, pfc, now_ms)``: None when ``pfc`` is a valid, unexpired cert for
    (pid, generation) signed by one of the keys in ``paths``, else the reason (``missing``,
    ``malformed``, ``wrong_length``, ``other_identity``, ``expired``, ``unknown_key``). The
    sink's broker rules and the producer's recovery scan use the same check.

    Raises:
        KeyFileError: a file is missing or not an Ed25519 public key, or none given.
    """
    keys = load_public_keys(paths)

    def verify(pid: int, generation: int, cert: bytes | None, now_ms: int) -> str | None:
        if cert is None:
            return "missing"
        check = verify_cert(cert, keys, pid, generation, now_ms)
        return None if check.ok else check.reason

    return verify


def generate_keypair(directory: str | Path) -> tuple[Path, Path]:
    """Write ``DIR/lease-signing.key`` (mode 0600) and ``DIR/lease-signing.pub``.

    Refuses to overwrite an existing private key (a rotation writes to a new directory).

    Raises:
        KeyFileError: the directory cannot be written or the key already exists.
    """
    import os

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
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # O_EXCL + 0600 at creation: the key is never readable by others, not even briefly.
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(
            f"{private_path} exists; keys are never overwritten (rotate into a new directory)"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(private_pem)
        public_path.write_bytes(public_pem)
    except OSError as exc:
        private_path.unlink(missing_ok=True)
        raise KeyFileError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    return private_path, public_path
