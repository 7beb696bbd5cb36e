"""One query per output path: the owner record, and the check before a query starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidfence.cli.exits import EXIT_UNAVAILABLE, code_of
from pidfence.spark_sink.errors import OutputOwnedError
from pidfence.spark_sink.query_owner import OWNER, check_owner, owner_of, take_ownership
from pidfence.spark_sink.storage import Store

QUERY_A = "0f1e2d3c-query-a"
QUERY_B = "0f1e2d3c-query-b"


def _checkpoint(folder: Path, query: str) -> str:
    """A checkpoint as Spark leaves it after starting ``query``: ``metadata`` holds its id."""
    folder.mkdir()
    (folder / "metadata").write_text(f'{{"id":"{query}"}}\n')
    return str(folder)


@pytest.fixture
def owned(tmp_path: Path) -> Store:
    """An output's own folder that query A claimed."""
    store = Store.at(str(tmp_path / "out" / "_pidfence"))
    take_ownership(store, QUERY_A)
    return store


def test_the_owners_checkpoint_passes_the_check(owned: Store, tmp_path: Path) -> None:
    assert owner_of(owned) == QUERY_A
    check_owner(owned, _checkpoint(tmp_path / "ckpt", QUERY_A))


def test_another_querys_checkpoint_is_refused(owned: Store, tmp_path: Path) -> None:
    with pytest.raises(OutputOwnedError, match=f"belongs to streaming query {QUERY_A}"):
        check_owner(owned, _checkpoint(tmp_path / "ckpt", QUERY_B))


@pytest.mark.parametrize("checkpoint", [None, "new-checkpoint"])
def test_a_new_checkpoint_is_a_new_query_and_is_refused(
    owned: Store, tmp_path: Path, checkpoint: str | None
) -> None:
    where = None if checkpoint is None else str(tmp_path / checkpoint)
    with pytest.raises(OutputOwnedError, match="is a new query"):
        check_owner(owned, where)


def test_an_unowned_path_passes_the_check_with_any_checkpoint(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path / "out" / "_pidfence"))
    check_owner(store, None)
    check_owner(store, _checkpoint(tmp_path / "ckpt", QUERY_B))


@pytest.mark.parametrize("body", [b'{"query": "0f1e2d3c-qu', b"[]", b'{"query": 7}'])
def test_a_damaged_owner_record_stops_the_sink_for_good(tmp_path: Path, body: bytes) -> None:
    """Not taken for an unowned path, and not a raw parse error either: inside a Spark task
    that would be a retriable failure (exit 75) a rerun meets again."""
    store = Store.at(str(tmp_path / "out" / "_pidfence"))
    store.put(store.join(OWNER), body)  # overwritten by hand
    with pytest.raises(OutputOwnedError) as info:
        check_owner(store, None)
    assert code_of(info.value) == EXIT_UNAVAILABLE
    assert "damaged" in str(info.value) and "delete it" in str(info.value)
