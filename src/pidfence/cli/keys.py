"""``pidfence keys``: the lease server's Ed25519 signing key pair (``generate DIR``), the
per-record MAC secret (``mac-secret FILE``) and a throw-away PKI for demos (``pki DIR``).

Exit codes as every command: 0 done, 2 usage (a bad argument, a file that exists already, a
PKI in DIR already without ``--force``), 3 a file that cannot be written."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from pidfence.cli.exits import EXIT_UNAVAILABLE, EXIT_USAGE, fail

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
    keys = typer.Typer(
        no_args_is_help=True,
        help="Lease signing keys and the record MAC secret (docs/lease-server.md).",
    )

    @keys.command("generate")
    def generate(
        directory: Annotated[Path, typer.Argument(help="Where to write the key pair")],
    ) -> None:
        """Write DIR/lease-signing.key (private, mode 0600) and DIR/lease-signing.pub."""
        from pidfence.wire import generate_keypair

        with _key_errors("keys generate"):
            private_path, public_path = generate_keypair(directory)
        typer.echo(f"private key: {private_path} (give it to: pidfence lease-server --signing-key)")
        typer.echo(f"public key:  {public_path} (give it to: pidfence sink --lease-public-key)")

    @keys.command("mac-secret")
    def mac_secret(
        file: Annotated[Path, typer.Argument(help="Where to write the secret (must not exist)")],
    ) -> None:
        """Write a new per-record MAC secret (64 hex digits, mode 0600) to FILE."""
        from pidfence.wire import generate_mac_secret

        with _key_errors("keys mac-secret"):
            path = generate_mac_secret(file)
        typer.echo(
            f"record MAC secret: {path} (give it to: pidfence lease-server --record-mac-secret, "
            "and to the sink)"
        )

    @keys.command("pki")
    def pki(
        directory: Annotated[Path, typer.Argument(help="Where to write everything")],
        host: Annotated[
            list[str] | None, typer.Option(help="DNS name for the server certificate (repeat)")
        ] = None,
        client: Annotated[
            list[str] | None, typer.Option(help="Token name to make (repeat)")
        ] = None,
        force: Annotated[
            bool, typer.Option("--force", help="Replace the CA, certificates and tokens in DIR")
        ] = False,
    ) -> None:
        """A throw-away CA, lease-server and client certificates, auth tokens, a ZooKeeper
        password and a signing key pair (demo, compose, tests; not for production). Refuses a
        DIR that holds a CA already (its servers and clients would stop trusting each other)
        unless --force."""
        from pidfence.services.lease_server import make_lease_pki

        if (directory / "ca.pem").exists() and not force:
            fail(
                "keys pki",
                f"{directory} holds a PKI already (ca.pem): keep it, pick another DIR, or add "
                "--force to replace the CA, server certificate and tokens",
                EXIT_USAGE,
            )

        with _key_errors("keys pki"):
            made = make_lease_pki(
                directory,
                clients=tuple(client or ("producer", "sink", "other")),
                hosts=tuple(host or ("localhost",)),
            )
        typer.echo(f"ca: {made.ca}\nauth tokens: {made.tokens_file}\nzk auth: {made.zk_auth_file}")
        typer.echo(f"signing key: {made.signing_key}\npublic key: {made.public_key}")
        typer.echo(f"record MAC secret: {made.record_mac_secret}")
        for name, path in made.token_files.items():
            typer.echo(f"token of {name}: {path}")

    app.add_typer(keys, name="keys")


@contextmanager
def _key_errors(command: str) -> Iterator[None]:
    """A key file that exists is a usage error (2: pick another path); one that cannot be
    written is 3."""
    from pidfence.wire.cert import KeyFileError, KeyFileExists

    try:
        yield
    except KeyFileError as exc:
        fail(command, str(exc), EXIT_USAGE if isinstance(exc, KeyFileExists) else EXIT_UNAVAILABLE)
    except OSError as exc:
        fail(command, f"cannot write: {exc}", EXIT_UNAVAILABLE)
