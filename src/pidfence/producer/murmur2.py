"""Kafka's default partitioner for keyed records: ``Utils.murmur2`` exactly, as Java computes it."""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``org.apache.kafka.common.utils.Utils.murmur2``: a signed 32-bit hash.

    Java wraps every multiplication at 32 bits and ``>>>`` is an unsigned shift; masking each
    step to 32 bits reproduces both, then the result is read back as a signed int.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``: ``toPositive(murmur2) % n``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
