"""One query per output path, enforced with an owner record (``P/_pidfence/_owner.json``).

The first query to start on a path takes it (create-if-absent); any other query id is refused
with :class:`OutputOwnedError` before it writes or deletes anything; a restart of the same query
(same checkpoint, hence same query id) simply continues as the owner.
"""

from __future__ import annotations

import json

from pidfence.spark_sink.errors import OutputOwnedError
from pidfence.spark_sink.spark_checkpoint import checkpoint_query_id
from pidfence.spark_sink.storage import Store

OWNER = "_owner.json"


def owner_of(store: Store) -> str | None:
    """The query id that owns the output path, or None.

    Raises:
        OutputOwnedError: the owner record is not one the sink wrote (it is written whole,
            once, so only a hand edit or outside damage gets here): a rerun meets it again.
    """
    where = store.join(OWNER)
    try:
        data = json.loads(store.read(where))
    except FileNotFoundError:
        return None
    except ValueError:
        data = None
    owner = data.get("query") if isinstance(data, dict) else None
    if not isinstance(owner, str):
        raise OutputOwnedError(
            f'the owner record {where} is damaged (not {{"query": ID}}): if no streaming '
            "query writes to this output, delete it and start again; otherwise stop that query"
        )
    return owner


def take_ownership(store: Store, query_id: str) -> None:
    """Make ``query_id`` the owner of the path, or raise if another query owns it.

    Raises:
        OutputOwnedError: the path belongs to another query.
    """
    body = json.dumps({"query": query_id}, sort_keys=True).encode()
    if store.put_if_absent(store.join(OWNER), body):
        return
    owner = owner_of(store)
    if owner != query_id:
        raise OutputOwnedError(
            f"output path {store.root} belongs to streaming query {owner}; this is query "
            f"{query_id}. Run one query per output path: stop the other one or choose another "
            f"path (a restart of the same query, from its checkpoint, takes over)"
        )


def check_owner(store: Store, checkpoint: str | None) -> None:
    """Refuse, before anything starts, a path another query owns (what :func:`claim` would
    refuse once the query runs): the checkpoint names the query this run continues, a new
    checkpoint is a new query.

    Raises:
        OutputOwnedError: the path belongs to another query.
    """
    owner = owner_of(store)
    if owner is None:
        return
    query = checkpoint_query_id(checkpoint)
    if owner != query:
        this = f"query {query}" if query else "a new query"
        raise OutputOwnedError(
            f"output {store.root} belongs to streaming query {owner}, and checkpoint "
            f"{checkpoint} is {this}: stop the other query and use its checkpoint, or choose "
            "another --output"
        )
