"""`pidfence services` (placeholder until its issue lands)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's command(s) to the `pidfence` app."""
    del app
