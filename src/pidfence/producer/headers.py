"""Which headers besides ``pf`` a record carries: the lease's certificate and the record MAC.

:class:`~pidfence.producer.session.ProducerSession` makes the decision through these functions
(DESIGN §3 amended again): the lease's ``pfc`` goes on every FENCE of the current generation, on
the first data record of each (pid, generation) per partition, and again on each partition's next
record every ``restamp_ms``. With a version 2 certificate (it names this producer's key) the
``pfc`` is *placed*: the certificate plus this producer's signature over (topic, partition, pid,
generation, seq, flags), so a copy admits nothing elsewhere. With a lease MAC key every record
also carries ``pfm``, its keyed BLAKE2b MAC.
"""

from __future__ import annotations

from typing import NamedTuple

from pidfence.producer.sequencer import Sequencer
from pidfence.wire import CERT_HEADER_KEY, FLAG_FENCE, PF_HEADER_KEY
from pidfence.wire.mac import MAC_HEADER_KEY, record_mac_from
from pidfence.wire.statement import encode_placed_pfc

#: One Kafka header as the producer sends it.
Header = tuple[str, bytes]
#: The headers the producer stamps: a caller's header of one of these names is refused, and a
#: copier drops them from its input.
RESERVED_HEADERS = (PF_HEADER_KEY, CERT_HEADER_KEY, MAC_HEADER_KEY)
_NONE: tuple[Header, ...] = ()


class Fence(NamedTuple):
    """A FENCE record to write: where, its ``pf`` header and its extra headers."""

    topic: str
    partition: int
    header: bytes
    extras: tuple[Header, ...]


def owes_cert(current: Sequencer, topic: str, partition: int, flags: int) -> bool:
    """Whether a record of (topic, partition) carries a ``pfc`` (cheap: no signature)."""
    if current.cert is None:
        return False
    return bool(flags & FLAG_FENCE) or (topic, partition) not in current.certified


def cert_headers(
    current: Sequencer, topic: str, partition: int, seq: int, flags: int
) -> tuple[Header, ...]:
    """The ``pfc`` header of the record (topic, partition, seq, flags), or nothing."""
    cert = current.cert
    if cert is None or not owes_cert(current, topic, partition, flags):
        return _NONE
    signer = current.signer
    if signer is None:
        return ((CERT_HEADER_KEY, cert),)
    pfc = encode_placed_pfc(
        cert, signer, topic, partition, current.pid, current.generation, seq, flags
    )
    return ((CERT_HEADER_KEY, pfc),)


def mac_headers(
    current: Sequencer,
    topic: str,
    partition: int,
    seq: int,
    flags: int,
    key: bytes | None,
    value: bytes | None,
    generation: int | None = None,
) -> tuple[Header, ...]:
    """The ``pfm`` header when the lease carries a MAC key, else nothing; ``generation``
    defaults to the lease's (a resume's FENCE walk tags lower generations too: the key is the
    pid's)."""
    hasher = current.mac_hasher
    if hasher is None:
        return _NONE
    if generation is None:
        generation = current.generation
    mac = record_mac_from(hasher, topic, partition, current.pid, generation, seq, flags, key, value)
    return ((MAC_HEADER_KEY, mac),)
