"""``--lease-public-key FILE[,FILE]`` (repeatable) as read by produce, copy and sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.cli.keys import key_paths, producer_public_keys
from pidfence.wire.cert import KeyFileError, generate_keypair


def test_key_paths_split_commas_and_repeats_and_drop_blanks() -> None:
    assert key_paths(None) == ()
    assert key_paths(["a.pub, b.pub", " ", "c.pub,"]) == ("a.pub", "b.pub", "c.pub")


def test_producer_public_keys_loads_each_file_now(tmp_path: Path) -> None:
    _, public = generate_keypair(tmp_path / "k")
    assert producer_public_keys([str(public)]) == (str(public),)
    assert producer_public_keys(None) == ()
    with pytest.raises(KeyFileError, match="cannot read public key"):
        producer_public_keys([str(public), str(tmp_path / "missing.pub")])
