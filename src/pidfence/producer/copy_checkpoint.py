"""A copy task's checkpoint as its group commits it: Kafka's committed offset of the input
partition, with the task's producer checkpoint in the offset commit's metadata string.

Kafka keeps the offset and its metadata in one record of ``__consumer_offsets``, so they are
stored atomically, any member of the group reads them (``OffsetFetch``), and the group
coordinator refuses a commit from a member that is no longer in the group. The metadata is
``{"v": 1, "to": OUTPUT_TOPIC, "cp": ProducerCheckpoint.to_dict()}`` as JSON: at most about 460
bytes plus six times the output topic's name, 1,954 bytes for Kafka's longest name (249
characters) and 2,649 sealed; the broker's ``offset.metadata.max.bytes`` is 4096 by default.
While a resume carries its predecessor's timeout holes (``resend``, ``ahead_holes``: rare, 16 at
most) it grows by two more names and about 25 bytes a hole: a sealed checkpoint of a
249-character topic with many holes can pass the limit, and is refused before the commit.

The checkpoint holds the pid's ``secret``, which lets its holder bump the pid. Whoever may
``DESCRIBE`` the group can read committed metadata: restrict it to the copiers (Kafka ACLs), or
seal the metadata with a group key (:class:`GroupKey`, AES-GCM bound to the group, input topic
and partition, so a sealed checkpoint cannot be read without the key nor moved elsewhere).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.errors import BadCheckpoint, ProducerConfigError
from pidfence.wire import KeyFileError
from pidfence.wire.cert import read_private_file

METADATA_VERSION = 1
#: Kafka's default ``offset.metadata.max.bytes``.
METADATA_LIMIT = 4096
_SEALED = "pfs1:"
_KEY_BYTES = 32
_NONCE_BYTES = 12


@dataclass(frozen=True)
class GroupKey:
    """The key that seals a copy group's committed checkpoints (32 bytes, every member's).

    Make one with ``openssl rand -hex 32 > copy-group.key && chmod 600 copy-group.key``.
    """

    key: bytes = field(repr=False)

    @classmethod
    def load(cls, path: str | Path) -> GroupKey:
        """The key in ``path`` (64 hex digits, mode 0600).

        Raises:
            ProducerConfigError: missing, readable by others, or not 64 hex digits.
        """
        try:
            raw = read_private_file(path, "copy group key")
            key = bytes.fromhex(raw.decode("ascii").strip())
        except (KeyFileError, UnicodeDecodeError, ValueError) as exc:
            raise ProducerConfigError(
                f"copy group key {path}: {exc}; it must hold 64 hex digits, mode 0600 (make one "
                "with `openssl rand -hex 32 > FILE && chmod 600 FILE`)"
            ) from None
        if len(key) != _KEY_BYTES:
            raise ProducerConfigError(f"copy group key {path} must hold 64 hex digits")
        return cls(key)


@dataclass(frozen=True)
class MetadataCodec:
    """Encodes and decodes one group's committed checkpoints of one input topic.

    Args:
        group: the consumer group.
        from_topic: the input topic (its partitions are the tasks).
        to_topic: the output topic, recorded and checked (a group reused for another output
            would continue pids that never wrote it).
        key: seals the metadata when set.
    """

    group: str
    from_topic: str
    to_topic: str
    key: GroupKey | None = None

    def _aad(self, partition: int) -> bytes:
        return f"{self.group}\0{self.from_topic}\0{partition}".encode()

    def encode(self, partition: int, checkpoint: ProducerCheckpoint) -> str:
        """The metadata string committed with ``partition``'s offset.

        Raises:
            BadCheckpoint: it would exceed :data:`METADATA_LIMIT` (a topic name too long).
        """
        text = json.dumps(
            {"v": METADATA_VERSION, "to": self.to_topic, "cp": checkpoint.to_dict()},
            separators=(",", ":"),
        )
        if self.key is not None:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = AESGCM(self.key.key).encrypt(nonce, text.encode(), self._aad(partition))
            text = _SEALED + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")
        if len(text.encode()) > METADATA_LIMIT:
            raise BadCheckpoint(
                f"the checkpoint of {self.from_topic}[{partition}] takes {len(text)} bytes, over "
                f"Kafka's default offset.metadata.max.bytes ({METADATA_LIMIT}); use a shorter "
                "output topic name"
            )
        return text

    def decode(self, partition: int, metadata: str | None) -> ProducerCheckpoint:
        """The producer checkpoint committed with ``partition``'s offset.

        Raises:
            BadCheckpoint: no metadata (another consumer committed in this group), another
                output topic, a sealed one without the key (or with another key), or garbage.
        """
        where = f"group {self.group!r}, {self.from_topic}[{partition}]"
        text = metadata or ""
        if text.startswith(_SEALED):
            text = self._open(partition, text[len(_SEALED) :], where)
        elif self.key is not None and text:
            raise BadCheckpoint(
                f"{where}: the committed checkpoint is not sealed although --group-key is "
                "given; start the group sealed from its first run (or drop --group-key)"
            )
        try:
            data = json.loads(text)
            to_topic = data["to"]
            if data["v"] != METADATA_VERSION:
                raise ValueError(f"version {data['v']!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise BadCheckpoint(
                f"{where}: the committed offset carries no copier checkpoint ({exc!r}); the "
                "group is used by other consumers: give pidfence copy a group of its own"
            ) from None
        if to_topic != self.to_topic:
            raise BadCheckpoint(
                f"{where}: the group copies to {to_topic!r}, not {self.to_topic!r}; use "
                "another --group for another output topic"
            )
        return ProducerCheckpoint.from_dict(data["cp"])

    def _open(self, partition: int, sealed: str, where: str) -> str:
        if self.key is None:
            raise BadCheckpoint(f"{where}: the committed checkpoint is sealed; give --group-key")
        try:
            raw = base64.urlsafe_b64decode(sealed)
            plain = AESGCM(self.key.key).decrypt(
                raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._aad(partition)
            )
            return plain.decode()
        except (ValueError, InvalidTag):
            raise BadCheckpoint(
                f"{where}: the committed checkpoint does not open with this --group-key (another "
                "key, or it was sealed for another group or partition); give every member the "
                "same key"
            ) from None
