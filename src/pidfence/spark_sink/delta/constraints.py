"""CHECK constraints another writer added to a pidfence table, enforced on the sink's rows.

A Delta writer must not add rows that a table's ``delta.constraints.NAME`` expression rejects.
deltalake's file-level commit does not evaluate them, so the sink does, with Polars' SQL
expressions, before each commit of a table that has any (a table without constraints costs
nothing). A constraint the batch's rows satisfy never stops the sink; one they violate, or one
Polars cannot evaluate, ends the run with :class:`ConstraintViolated` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import pyarrow as pa

from pidfence.spark_sink.delta.errors import ConstraintViolated

PREFIX: Final = "delta.constraints."
#: String literals and quoted identifiers, left as they are when column names are quoted.
_QUOTED: Final = re.compile(r"('(?:[^']|'')*'|`[^`]*`|\"[^\"]*\")")


def constraints_of(configuration: Mapping[str, str]) -> dict[str, str]:
    """``{name: expression}`` of a table's CHECK constraints."""
    return {k[len(PREFIX) :]: v for k, v in configuration.items() if k.startswith(PREFIX)}


def _quote_columns(expression: str, columns: list[str]) -> str:
    """Backtick every column name outside literals (``offset`` is an SQL keyword to Polars;
    Delta column names are case-insensitive, Polars' are not)."""
    if not columns:
        return expression
    names = {c.lower(): c for c in columns}
    word = re.compile(
        r"(?<![\w.`])(" + "|".join(re.escape(c) for c in columns) + r")(?![\w`(])", re.IGNORECASE
    )
    pieces = _QUOTED.split(expression)
    for i in range(0, len(pieces), 2):  # even pieces are outside quotes
        pieces[i] = word.sub(lambda m: f"`{names[m.group(1).lower()]}`", pieces[i])
    return "".join(pieces)


def check_rows(rows: pa.Table, constraints: Mapping[str, str], where: str, batch: int) -> None:
    """Raise :class:`ConstraintViolated` if a row fails a constraint (null passes, as in SQL).

    Args:
        rows: the batch's rows for this table.
        constraints: ``{name: expression}``.
        where: the table, for the message.
        batch: the batch id, for the message.
    """
    if not constraints or rows.num_rows == 0:
        return
    import polars as pl

    frame = pl.DataFrame(rows)
    for name, expression in sorted(constraints.items()):
        fix = (
            f"drop it (ALTER TABLE ... DROP CONSTRAINT {name}) or change it, then run again: "
            "the batch commits once the table lets its rows in"
        )
        try:
            ok = frame.select(pl.sql_expr(_quote_columns(expression, rows.column_names)))
            failed = int((ok.to_series(0) == False).sum())  # noqa: E712 - null passes
        except Exception as exc:
            raise ConstraintViolated(
                f"{where}: the table's constraint {name} ({expression}) cannot be evaluated on "
                f"batch {batch} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); {fix}"
            ) from exc
        if failed:
            raise ConstraintViolated(
                f"{where}: the table's constraint {name} ({expression}) rejects {failed} of batch "
                f"{batch}'s {rows.num_rows} rows; nothing was committed. {fix[0].upper()}{fix[1:]}"
            )


__all__ = ["check_rows", "constraints_of"]
