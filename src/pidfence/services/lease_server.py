"""``pidfence lease-server`` as a managed subprocess: the one spawner for tests, chaos and demo.

Built on :class:`ManagedProcess`, so the suite's leftover-process check sees it and the fault
hooks (``kill``/``pause``/``resume``/``restart``) are the same as for every other node. Ready
means a real ping answered (``LeaseClient.ping``), not an open port: a frozen server fails it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseError,
    LeaseServerSettings,
    client_tls_context,
    load_token_file,
)
from pidfence.pid_allocator.settings_sources import settings_argv
from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess, RunsProcess, ServiceFailed, wait_until

#: The ``pidfence`` CLI run by this interpreter (no console script on PATH needed).
_PIDFENCE = (sys.executable, "-c", "from pidfence.cli import main; main()")


@dataclass
class LeaseServerProcess(RunsProcess):
    """A ``pidfence lease-server`` subprocess on 127.0.0.1.

    Attributes:
        proc: the managed process (fault hooks, log).
        port: its listen port (kept across restarts).
        tls_ca: CA that signed its TLS certificate, for readiness pings (None: plain TCP).
    """

    proc: ManagedProcess
    port: int
    tls_ca: Path | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def ping(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """One ping (no retries).

        Raises:
            LeaseError: no reply.
        """
        tls = None if self.tls_ca is None else client_tls_context(self.tls_ca)
        with LeaseClient(
            self.address,
            connect_timeout_s=timeout_s,
            request_timeout_s=timeout_s,
            retries=0,
            tls=tls,
        ) as client:
            return client.ping()

    def wait_listening(self, timeout: float = 60.0) -> None:
        """Return once a ping is answered.

        Raises:
            ServiceFailed: the process exited (at once, with its log) or never answered.
        """

        def ready() -> bool:
            if not self.proc.running:
                raise ServiceFailed(
                    f"lease server {self.address} exited with {self.proc.exit_code()}:\n"
                    f"{self.proc.log_tail()}"
                )
            try:
                self.ping()
            except LeaseError:
                return False
            return True

        wait_until(ready, timeout, f"lease server {self.address}", 0.1, self.proc.log_tail())

    def restart(self, timeout: float = 60.0) -> None:
        """Start again on the same port; return once it answers pings."""
        self.proc.start()
        self.wait_listening(timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return self.proc.log_tail(lines)


def spawn_lease_server(
    zk_hosts: str,
    log_dir: Path,
    name: str = "lease",
    *,
    port: int | None = None,
    settings: LeaseServerSettings | None = None,
    tls_ca: Path | None = None,
    wait: bool = True,
    timeout: float = 60.0,
    **overrides: Any,
) -> LeaseServerProcess:
    """Start ``pidfence lease-server`` on 127.0.0.1 (a free port unless ``port``).

    Args:
        zk_hosts: ZooKeeper connect string (with chroot).
        log_dir: where ``NAME.log`` goes.
        name: process name.
        port: listen port (default: a free one).
        settings: the server's settings (host and port are taken from here unless given).
        tls_ca: CA of the server's TLS certificate, for readiness pings.
        wait: return only once a ping is answered.
        timeout: how long to wait for that.
        **overrides: settings fields, e.g. ``lifetime_ms=6000, auth_tokens_file=path``.

    Raises:
        ServiceFailed: it exited or did not answer within ``timeout`` (log included).
    """
    chosen = port or free_port()
    base = settings or LeaseServerSettings()
    full = base.with_overrides(host="127.0.0.1", port=chosen, zk_hosts=zk_hosts, **overrides)
    argv = [*_PIDFENCE, "lease-server", *settings_argv(full)]
    proc = ManagedProcess(name, argv, log_dir / f"{name}.log")
    proc.start()
    handle = LeaseServerProcess(proc, chosen, tls_ca)
    if wait:
        try:
            handle.wait_listening(timeout)
        except BaseException:
            proc.kill()
            raise
    return handle


class SecuredServerOptions(TypedDict):
    """The lease-server settings of :meth:`LeasePki.server_options`."""

    auth_tokens_file: Path
    tls_cert: Path
    tls_key: Path
    tls_ca: Path


@dataclass(frozen=True)
class LeasePki:
    """Everything a secured lease server and its clients need, made by :func:`make_lease_pki`.

    Attributes:
        ca: CA certificate (PEM) that signed both certificates; clients trust it.
        server_cert: server certificate for 127.0.0.1 and localhost.
        server_key: its key.
        client_cert: a client certificate (mutual TLS).
        client_key: its key.
        tokens_file: ``NAME TOKEN`` lines for ``--auth-tokens`` (clients ``producer`` and
            ``other``).
        token_files: client name -> file holding its token (``$PIDFENCE_LEASE_TOKEN_FILE``).
        zk_auth_file: ``USER:PASSWORD`` for ``--zk-auth-file``.
        signing_key: Ed25519 private key for ``--signing-key``.
        public_key: its public key for ``--lease-public-key``.
        record_mac_secret: the per-record MAC secret for ``--record-mac-secret`` (lease server)
            and the sink.
    """

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    tokens_file: Path
    token_files: dict[str, Path]
    zk_auth_file: Path
    signing_key: Path
    public_key: Path
    record_mac_secret: Path

    def server_options(self) -> SecuredServerOptions:
        """Lease-server settings for token authentication over TLS: ``auth_tokens_file``,
        ``tls_cert``, ``tls_key`` and ``tls_ca``."""
        return {
            "auth_tokens_file": self.tokens_file,
            "tls_cert": self.server_cert,
            "tls_key": self.server_key,
            "tls_ca": self.ca,
        }

    def client_options(self, name: str = "producer") -> dict[str, Any]:
        """:class:`~pidfence.pid_allocator.LeaseClient` options of client ``name``: its token
        and a TLS context that trusts :attr:`ca`."""

        return {
            "token": load_token_file(self.token_files[name]),
            "tls": client_tls_context(self.ca),
        }


def _write_private(path: Path, data: bytes) -> Path:
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return path


def make_lease_pki(
    directory: Path,
    clients: tuple[str, ...] = ("producer", "other"),
    hosts: tuple[str, ...] = ("localhost",),
) -> LeasePki:
    """Make a throw-away CA, server and client certificates, auth tokens, a ZooKeeper password,
    a signing key pair and a record-MAC secret in ``directory`` (for tests, the demo and
    compose). Secrets are 0600; an existing signing key pair or MAC secret is kept.

    Args:
        directory: where the files go (created).
        clients: token names to make.
        hosts: DNS names in the server certificate (127.0.0.1 is always in it).
    """
    import datetime
    import ipaddress
    import secrets

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from pidfence.wire import generate_keypair, generate_mac_secret

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def cert(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: x509.Name | None,
        issuer_key: ec.EllipticCurvePrivateKey,
        *,
        ca: bool = False,
        server: bool = False,
    ) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        *(x509.DNSName(host) for host in hosts),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("pidfence test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = cert("lease-server", server_key, ca_cert.subject, ca_key, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = cert("lease-client", client_key, ca_cert.subject, ca_key)
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (directory / "server.pem").write_bytes(server_cert.public_bytes(pem))
    (directory / "client.pem").write_bytes(client_cert.public_bytes(pem))
    _write_private(directory / "server.key", key_pem(server_key))
    _write_private(directory / "client.key", key_pem(client_key))
    tokens = {name: secrets.token_urlsafe(24) for name in clients}
    tokens_file = _write_private(
        directory / "auth-tokens",
        "".join(f"{name} {token}\n" for name, token in tokens.items()).encode(),
    )
    token_files = {
        name: _write_private(directory / f"{name}.token", f"{token}\n".encode())
        for name, token in tokens.items()
    }
    zk_auth = _write_private(
        directory / "zk-auth", f"pidfence:{secrets.token_urlsafe(18)}\n".encode()
    )
    keys = directory / "keys"
    if (keys / "lease-signing.key").exists():
        private_key, public_key = keys / "lease-signing.key", keys / "lease-signing.pub"
    else:
        private_key, public_key = generate_keypair(keys)
    mac_secret = directory / "record-mac.secret"
    if not mac_secret.exists():
        generate_mac_secret(mac_secret)
    return LeasePki(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
        tokens_file,
        token_files,
        zk_auth,
        private_key,
        public_key,
        mac_secret,
    )
