"""A partition's state files: read back as written, refused when damaged, old chains dropped."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pidfence.broker_plugin import CorruptSnapshot
from pidfence.spark_sink.state_files import (
    StateFile,
    decode_state,
    drop_old_chains,
    encode_state,
    state_name,
)
from pidfence.spark_sink.storage import Store

_STATE = StateFile(
    kind="delta",
    prev=3,
    prev_name=state_name(3, "e1-aa", "full"),
    tag="e1-bb",
    table=b"\x01snapshot-bytes\x02",
    next_log=42,
)


def test_a_state_file_read_back_is_the_one_written() -> None:
    assert decode_state(encode_state(_STATE)) == _STATE


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(lambda data: 0, id="magic"),
        pytest.param(lambda data: 5, id="crc"),
        # Still well-formed msgpack: only the checksum tells this damage.
        pytest.param(lambda data: data.index(b"snapshot-bytes"), id="snapshot"),
    ],
)
def test_a_state_file_with_one_damaged_byte_is_refused(where: Callable[[bytes], int]) -> None:
    data = bytearray(encode_state(_STATE))
    data[where(bytes(data))] ^= 0x20
    with pytest.raises(CorruptSnapshot, match="it will be rebuilt"):
        decode_state(bytes(data))


def test_old_chains_before_the_floor_are_dropped_and_the_floors_kept(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    names = [state_name(b, "e1-aa", kind) for b in range(5) for kind in ("full", "delta")]
    for name in [*names, "notes.txt"]:
        store.put(store.join("d", name), b"x")
    drop_old_chains(store, store.join("d"), 3)
    kept = [n for n in names if int(n.partition(".")[0]) >= 3]
    assert store.list(store.join("d")) == sorted([*kept, "notes.txt"])
