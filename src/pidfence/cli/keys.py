"""``pidfence keys generate DIR``: the lease server's Ed25519 signing key pair."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

#: ``--lease-public-key`` of ``pidfence produce`` and ``pidfence copy``.
ProducerPublicKeys = Annotated[
    list[str] | None,
    typer.Option(
        "--lease-public-key",
        help="PEM public key(s) of the lease servers (FILE[,FILE], repeatable): a resume's "
        "recovery scan ignores FENCEs and pids without a valid certificate, as the verifying "
        "sink does (set it whenever the sink has --lease-public-key)",
    ),
]


def key_paths(values: Iterable[str] | None) -> tuple[str, ...]:
    """The files named by a repeatable ``--lease-public-key FILE[,FILE]``."""
    return tuple(k.strip() for item in values or () for k in item.split(",") if k.strip())


def producer_public_keys(values: Iterable[str] | None) -> tuple[str, ...]:
    """:func:`key_paths`, each file loaded once now so a missing or wrong one fails before any
    lease is taken (``KeyFileError``), not at the first resume."""
    paths = key_paths(values)
    if paths:
        from pidfence.wire.cert import load_public_keys

        load_public_keys(paths)
    return paths


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

    @keys.command("pki")
    def pki(
        directory: Annotated[Path, typer.Argument(help="Where to write everything")],
        host: Annotated[
            list[str] | None, typer.Option(help="DNS name for the server certificate (repeat)")
        ] = None,
        client: Annotated[
            list[str] | None, typer.Option(help="Token name to make (repeat)")
        ] = None,
    ) -> None:
        """A throw-away CA, lease-server and client certificates, auth tokens, a ZooKeeper
        password and a signing key pair (demo, compose, tests; not for production)."""
        from pidfence.services.lease_server import make_lease_pki

        made = make_lease_pki(
            directory,
            clients=tuple(client or ("producer", "sink", "other")),
            hosts=tuple(host or ("localhost",)),
        )
        typer.echo(f"ca: {made.ca}\nauth tokens: {made.tokens_file}\nzk auth: {made.zk_auth_file}")
        for name, path in made.token_files.items():
            typer.echo(f"token of {name}: {path}")

    app.add_typer(keys, name="keys")
