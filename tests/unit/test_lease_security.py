"""``pid_allocator.security``: the lease server's secret files and its TLS, without a server."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator import client_tls_context
from pidfence.pid_allocator.security import (
    SecretFileError,
    lease_client_options,
    load_auth_tokens,
    load_token_file,
    load_zk_auth,
    server_tls_context,
)
from pidfence.services.lease_server import LeasePki, make_lease_pki

TOKEN = "t" * 16  # the shortest token the file format accepts


def _private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_an_auth_tokens_file_maps_tokens_to_names(tmp_path: Path) -> None:
    tokens = _private(
        tmp_path / "tokens",
        f"# clients\nproducer {TOKEN}  # the load generator\n\nsink-1 {'s' * 40}\n",
    )
    assert load_auth_tokens(tokens) == {TOKEN: "producer", "s" * 40: "sink-1"}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"producer {TOKEN[:-1]}\n", id="token-of-15-characters"),
        pytest.param(f"producer {TOKEN}\nproducer {'u' * 16}\n", id="duplicate-name"),
        pytest.param(f"producer {TOKEN}\nsink {TOKEN}\n", id="duplicate-token"),
        pytest.param(f"pro ducer {TOKEN}\n", id="three-fields"),
        pytest.param(f"prod/ucer {TOKEN}\n", id="name-outside-the-alphabet"),
        pytest.param("# nothing but comments\n\n", id="no-token"),
    ],
)
def test_a_bad_auth_tokens_file_is_refused(tmp_path: Path, text: str) -> None:
    """A short token could be guessed; a name listed twice would let two clients share one
    share of the ring under two tokens: each is refused with the line it is on."""
    with pytest.raises(SecretFileError):
        load_auth_tokens(_private(tmp_path / "tokens", text))


_LOADERS: list[tuple[Callable[[Path], Any], str]] = [
    (load_auth_tokens, f"producer {TOKEN}\n"),
    (load_token_file, f"{TOKEN}\n"),
    (load_zk_auth, "pidfence:password\n"),
]


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o604, 0o602])
@pytest.mark.parametrize(("load", "text"), _LOADERS, ids=["auth-tokens", "token", "zk-auth"])
def test_a_secret_file_others_or_the_group_may_use_is_refused(
    tmp_path: Path, load: Callable[[Path], Any], text: str, mode: int
) -> None:
    path = _private(tmp_path / "secret", text)
    load(path)  # mode 0600: fine
    path.chmod(mode)
    with pytest.raises(SecretFileError, match="chmod 600"):
        load(path)


def test_a_zookeeper_auth_file_is_one_user_password_line(tmp_path: Path) -> None:
    assert load_zk_auth(_private(tmp_path / "zk", "pidfence:pass:word\n")) == (
        "pidfence",
        "pass:word",
    )


@pytest.mark.parametrize("text", ["pidfence:a\nother:b\n", "pidfence:\n", ":pw\n", "pidfence\n"])
def test_a_bad_zookeeper_auth_file_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(SecretFileError, match="one line USER:PASSWORD"):
        load_zk_auth(_private(tmp_path / "zk", text))


def test_a_client_certificate_without_a_ca_is_refused(tmp_path: Path) -> None:
    """Mutual TLS without trusting the server's CA would mean no TLS at all: refused."""
    pki = make_lease_pki(tmp_path)
    with pytest.raises(SecretFileError, match="lease-tls-ca"):
        lease_client_options(tls_cert=pki.client_cert, tls_key=pki.client_key, env={})
    options = lease_client_options(
        tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, env={}
    )
    assert isinstance(options["tls"], ssl.SSLContext)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A TLS handshake and one byte each way between two contexts, in memory; raises
    ``ssl.SSLError`` where either side refuses the other."""
    to_server, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    to_client, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    s_side = server.wrap_bio(to_server, from_server, server_side=True)
    c_side = client.wrap_bio(to_client, from_client, server_hostname="localhost")

    def carry() -> None:
        to_server.write(from_client.read())
        to_client.write(from_server.read())

    pending = [c_side, s_side]
    for _ in range(10):  # a handshake takes a few flights; each pass carries one each way
        for side in list(pending):
            try:
                side.do_handshake()
                pending.remove(side)
            except ssl.SSLWantReadError:
                pass
        carry()
        if not pending:
            break
    assert not pending, "the handshake did not finish"
    # TLS 1.3 gives the server's verdict on a client's certificate after the handshake.
    c_side.write(b"x")
    carry()
    assert s_side.read(1) == b"x"
    s_side.write(b"y")
    carry()
    assert c_side.read(1) == b"y"


@pytest.fixture
def pki(tmp_path: Path) -> LeasePki:
    return make_lease_pki(tmp_path)


def test_a_server_with_a_client_ca_refuses_a_client_without_a_certificate(pki: LeasePki) -> None:
    server = server_tls_context(pki.server_cert, pki.server_key, pki.ca)
    _handshake(server, client_tls_context(pki.ca, pki.client_cert, pki.client_key))
    with pytest.raises(ssl.SSLError):
        _handshake(server, client_tls_context(pki.ca))


def test_a_server_without_a_client_ca_takes_any_tls_client(pki: LeasePki) -> None:
    server = server_tls_context(pki.server_cert, pki.server_key)
    _handshake(server, client_tls_context(pki.ca))
