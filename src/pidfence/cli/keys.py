"""``pidfence keys generate DIR``: the lease server's Ed25519 signing key pair."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add ``keys`` to the ``pidfence`` app."""
    keys = typer.Typer(no_args_is_help=True, help="Lease signing keys (DESIGN.md §3 amended).")

    @keys.command("generate")
    def generate(
        directory: Annotated[Path, typer.Argument(help="Where to write the key pair")],
    ) -> None:
        """Write DIR/lease-signing.key (private, mode 0600) and DIR/lease-signing.pub."""
        from pidfence.wire import PidfenceError, generate_keypair

        try:
            private_path, public_path = generate_keypair(directory)
        except PidfenceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(75 if exc.retriable else 1) from None
        typer.echo(f"private key: {private_path} (give it to: pidfence lease-server --signing-key)")
        typer.echo(f"public key:  {public_path} (give it to: pidfence sink --lease-public-key)")

    app.add_typer(keys, name="keys")
