"""Loading the lease server's secrets: auth tokens, ZooKeeper digest auth, TLS contexts.

File formats (each file should be mode 0600; a group- or world-readable one is refused):

* auth tokens (``--auth-tokens``): one ``NAME TOKEN`` per line; ``#`` starts a comment. Names
  identify clients (their share of the ring and of the ZooKeeper queue), tokens authenticate.
* ZooKeeper auth (``--zk-auth-file``): one line ``USER:PASSWORD`` (digest scheme).
* a client token file (``$PIDFENCE_LEASE_TOKEN_FILE``): the token alone on the first line.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pidfence.wire import PidfenceError

_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


class SecretFileError(PidfenceError):
    """A token, password, key or certificate file is missing, unsafe or malformed."""


def _read_private(path: Path, what: str) -> str:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SecretFileError(f"{what} {path} is not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(
            f"{what} {path} is readable by others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
        )
    return text


def load_auth_tokens(path: Path) -> dict[str, str]:
    """``{token: name}`` from an auth tokens file.

    Raises:
        SecretFileError: unreadable, unsafe mode, a malformed line, a duplicate, or no token.
    """
    tokens: dict[str, str] = {}
    names: set[str] = set()
    for number, raw in enumerate(_read_private(path, "auth tokens file").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not _NAME.fullmatch(parts[0]) or len(parts[1]) < 16:
            raise SecretFileError(
                f"{path}:{number}: expected 'NAME TOKEN' (name of [A-Za-z0-9_.@-], token of "
                ">= 16 characters)"
            )
        name, token = parts
        if name in names or token in tokens:
            raise SecretFileError(f"{path}:{number}: duplicate name or token")
        names.add(name)
        tokens[token] = name
    if not tokens:
        raise SecretFileError(f"{path} lists no token; add 'NAME TOKEN' lines")
    return tokens


def load_token_file(path: Path) -> str:
    """The client token in ``path`` (first line).

    Raises:
        SecretFileError: unreadable, unsafe mode or empty.
    """
    lines = _read_private(path, "token file").strip().splitlines()
    if not lines or not lines[0].strip():
        raise SecretFileError(f"token file {path} is empty")
    return lines[0].strip()


def load_zk_auth(path: Path) -> tuple[str, str]:
    """``(user, password)`` for ZooKeeper digest auth.

    Raises:
        SecretFileError: unreadable, unsafe mode, or not ``USER:PASSWORD``.
    """
    text = _read_private(path, "ZooKeeper auth file").strip()
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise SecretFileError(f"{path} must hold one line USER:PASSWORD")
    return user, password


def server_tls_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """TLS for the lease server; with ``client_ca``, clients must present a certificate.

    Raises:
        SecretFileError: a file cannot be read or does not match.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        if client_ca is not None:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise SecretFileError(f"TLS setup failed ({cert}, {key}, {client_ca}): {exc}") from None
    return context


def client_tls_context(
    ca: Path, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """TLS for ``LeaseClient``: trust ``ca``; with ``cert``/``key`` present a client certificate.

    Raises:
        SecretFileError: a file cannot be read or does not match.
    """
    try:
        context = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise SecretFileError(f"TLS setup failed ({ca}, {cert}): {exc}") from None
    return context


#: Environment variables ``lease_client_options`` reads when no file is given.
TOKEN_ENV = "PIDFENCE_LEASE_TOKEN"  # noqa: S105 - a variable name
TOKEN_FILE_ENV = "PIDFENCE_LEASE_TOKEN_FILE"  # noqa: S105 - a variable name
TLS_CA_ENV = "PIDFENCE_LEASE_TLS_CA"


def lease_client_options(
    token_file: Path | None = None,
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``token=`` and ``tls=`` for ``LeaseClient`` from CLI options, else the environment.

    The token comes from ``token_file``, else ``$PIDFENCE_LEASE_TOKEN_FILE``, else
    ``$PIDFENCE_LEASE_TOKEN`` (never from a command-line value: it would show in ``ps``). TLS is
    on when ``tls_ca`` (or ``$PIDFENCE_LEASE_TLS_CA``) names a CA; ``tls_cert``/``tls_key`` add a
    client certificate for mutual TLS.

    Raises:
        SecretFileError: a named file is missing, unsafe or malformed.
    """
    environ = os.environ if env is None else env
    token: str | None = None
    file = token_file or (Path(environ[TOKEN_FILE_ENV]) if environ.get(TOKEN_FILE_ENV) else None)
    if file is not None:
        token = load_token_file(file)
    elif environ.get(TOKEN_ENV):
        token = environ[TOKEN_ENV].strip()
    ca = tls_ca or (Path(environ[TLS_CA_ENV]) if environ.get(TLS_CA_ENV) else None)
    if ca is None and tls_cert is not None:
        raise SecretFileError("a client certificate needs --lease-tls-ca (the server's CA) too")
    tls = None if ca is None else client_tls_context(ca, tls_cert, tls_key)
    return {"token": token, "tls": tls}
