"""Per-record MACs: a key per pid, derived from a secret the lease server and the sink share.

The optional per-record mode (DESIGN.md §3 amended again): the lease server runs with
``--record-mac-secret FILE`` and hands each lease, bump and roll reply the pid's ``mac_key`` =
:func:`derive_record_key` (secret, pid) (a roll reply also the rolled pid's, ``prior_mac_key``);
the producer tags every record with :func:`record_mac` under that key; the sink, holding the same
secret, derives the key again and checks each record. A topic writer who learns a live producer's
next seq cannot write a record the sink accepts inside its generation without the key.

The key is per pid, not per generation, so a resumed producer can check what its crashed
predecessor wrote (its recovery scan must not count an injected record as its own); the MAC binds
the generation instead, so a record cannot be moved to another generation.

Encodings (stable; changing them is a new version):

* record key = BLAKE2b(msgpack ``[2, pid]``, key=secret, digest_size=32,
  person=``b"pidfence-rmac"``);
* record MAC = BLAKE2b(prefix ‖ key ‖ value, key=record key, digest_size=16,
  person=``b"pidfence-record"``), where prefix = msgpack ``[topic, partition, pid, generation,
  seq, flags, key length, value length]``, a length -1 for None (an empty key is 0). The
  lengths in the prefix make the split between key and value unambiguous; key and value are fed
  with ``update()``, never copied.

Pure: no I/O beyond reading and creating the secret file.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

import msgpack

from pidfence.wire.cert import KeyFileError, create_private_file, read_private_file
from pidfence.wire.statement import RecordPlace

#: The Kafka header that carries a record's MAC.
MAC_HEADER_KEY = "pfm"
#: Bytes of the shared secret, of a record key and of a record MAC.
MAC_SECRET_BYTES = 32
RECORD_KEY_BYTES = 32
RECORD_MAC_BYTES = 16
RECORD_MAC_VERSION = 2
_KEY_PERSON = b"pidfence-rmac"
_MAC_PERSON = b"pidfence-record"
_WHAT = "record MAC secret"

#: What a record MAC covers: the record's place (:data:`~pidfence.wire.statement.RecordPlace`,
#: ``topic, partition, pid, generation, seq, flags``), then its Kafka key (None: no key) and its
#: value (None: a tombstone).
MacedRecord = tuple[*RecordPlace, bytes | None, bytes | None]
#: A :data:`MacedRecord` and the MAC it carries (``pfm``, None when absent).
MacChecked = tuple[*MacedRecord, bytes | None]


def load_mac_secret(path: str | Path) -> bytes:
    """The 32-byte secret in ``path`` (64 hex digits; surrounding whitespace ignored).

    Raises:
        KeyFileError: missing, unreadable, readable by group or others, or not 64 hex digits.
    """
    raw = read_private_file(path, _WHAT)
    try:
        secret = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) != MAC_SECRET_BYTES:
        raise KeyFileError(
            f"{_WHAT} {path} must hold {MAC_SECRET_BYTES * 2} hex digits; make one with "
            "`pidfence keys mac-secret FILE`"
        )
    return secret


def generate_mac_secret(path: str | Path) -> Path:
    """Write a new random secret to ``path`` (mode 0600, never overwriting one).

    Raises:
        KeyFileError: the file exists or cannot be written.
    """
    text = secrets.token_bytes(MAC_SECRET_BYTES).hex() + "\n"
    return create_private_file(path, text.encode("ascii"), _WHAT)


def derive_record_key(secret: bytes, pid: int) -> bytes:
    """The record key of ``pid`` under ``secret``."""
    message: bytes = msgpack.packb([RECORD_MAC_VERSION, pid])
    return hashlib.blake2b(
        message, key=secret, digest_size=RECORD_KEY_BYTES, person=_KEY_PERSON
    ).digest()


def record_hasher(record_key: bytes) -> hashlib.blake2b:
    """The keyed hash state of one record key, to pass to :func:`record_mac_from` per record
    (keying BLAKE2b costs about as much as hashing a short record, so a hot loop keys once)."""
    return hashlib.blake2b(key=record_key, digest_size=RECORD_MAC_BYTES, person=_MAC_PERSON)


def record_mac_from(
    hasher: hashlib.blake2b,
    topic: str,
    partition: int,
    pid: int,
    generation: int,
    seq: int,
    flags: int,
    key: bytes | None,
    value: bytes | None,
) -> bytes:
    """:func:`record_mac` from a :func:`record_hasher` state (left unchanged)."""
    # Parameters spelled out rather than *record: the producer calls this for every record.
    h = hasher.copy()
    h.update(
        msgpack.packb(
            [
                topic,
                partition,
                pid,
                generation,
                seq,
                flags,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
            ]
        )
    )
    if key:
        h.update(key)
    if value:
        h.update(value)
    return h.digest()


def record_mac(record_key: bytes, *record: *MacedRecord) -> bytes:
    """The 16-byte MAC of one ``record`` (:data:`MacedRecord`: where it is written, its ``pf``
    fields, key and value) under ``record_key``, the pid's key (:func:`derive_record_key`, the
    reply's ``mac_key``)."""
    return record_mac_from(record_hasher(record_key), *record)


def check_record_mac(record_key: bytes, *record: *MacChecked) -> bool:
    """Whether the ``record``'s last field, its ``pfm`` value, is its MAC under ``record_key``
    (constant-time comparison)."""
    return mac_matches(record_mac(record_key, *record[:-1]), record[-1])


def mac_matches(expected: bytes, mac: bytes | None) -> bool:
    """Whether a record's ``pfm`` value is ``expected`` (constant-time comparison)."""
    return mac is not None and len(mac) == RECORD_MAC_BYTES and hmac.compare_digest(expected, mac)


class RecordMacCheck:
    """The sink's side of per-record MACs: checks records against keys derived from ``secret``.

    Keyed hash states are cached per pid, most recently used kept, at most ``cache`` of them,
    so a steady stream derives each pid's key once.
    """

    def __init__(self, secret: bytes, cache: int = 4096) -> None:
        if len(secret) != MAC_SECRET_BYTES:
            raise ValueError(f"a record MAC secret has {MAC_SECRET_BYTES} bytes")
        self._secret = secret
        self._cache = cache
        self._hashers: dict[int, hashlib.blake2b] = {}

    def hasher(self, pid: int) -> hashlib.blake2b:
        """The keyed hash state of ``pid``."""
        hashers = self._hashers
        found = hashers.pop(pid, None)
        if found is None:
            found = record_hasher(derive_record_key(self._secret, pid))
            if len(hashers) >= self._cache:
                del hashers[next(iter(hashers))]
        hashers[pid] = found
        return found

    def valid(
        self,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        seq: int,
        flags: int,
        key: bytes | None,
        value: bytes | None,
        mac: bytes | None,
    ) -> bool:
        """Whether ``mac`` is the record's MAC under ``pid``'s key."""
        # Parameters spelled out rather than *record: the sink calls this for every record.
        if mac is None:
            return False
        expected = record_mac_from(
            self.hasher(pid), topic, partition, pid, generation, seq, flags, key, value
        )
        return mac_matches(expected, mac)
