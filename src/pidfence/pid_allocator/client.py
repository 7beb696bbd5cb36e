"""``LeaseClient``: the synchronous client producers use to lease, bump and roll pids, and sinks
use to ask what the lease authority knows of a pid (``describe``)."""

from __future__ import annotations

import itertools
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import Any

import msgpack

from pidfence.pid_allocator.decode import MAX_FRAME_BYTES
from pidfence.pid_allocator.errors import (
    InvalidServerList,
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    LeaseTlsMismatch,
    RateLimited,
    Unauthenticated,
    error_from_reply,
)
from pidfence.pid_allocator.protocol import LENGTH, PROTOCOL_VERSION, encode_frame
from pidfence.pid_allocator.security import TLS_CA_ENV, TOKEN_FILE_ENV
from pidfence.wire import PidState, PidStatus


@dataclass(frozen=True, slots=True)
class Lease:
    """A pid lease (or a bumped or rolled one).

    Attributes:
        pid: producer id, never reused.
        generation: fencing token; unique per (pid, generation) across all callers.
        sequence: first sequence number to use (0).
        expire_ms: lease end, epoch milliseconds.
        secret: the pid's capability: ``bump`` and ``roll`` require it. Store it like a
            password (checkpoints: mode 0600); never printed in ``repr``.
        cert: the lease server's signature over (pid, generation, expire_ms) when it signs
            (``pidfence.wire.cert``; version 2 names the producer key the request sent), else
            None.
        mac_key: the pid's record MAC key when the server runs with ``--record-mac-secret``
            (``pidfence.wire.mac``), else None. A secret like ``secret``; never in ``repr``.
        prior_mac_key: on a roll's answer, the rolled pid's record MAC key (its owner's
            recovery scan checks the records it wrote), else None.
    """

    pid: int
    generation: int
    sequence: int
    expire_ms: int
    secret: bytes = field(default=b"", repr=False)
    cert: bytes | None = field(default=None, repr=False)
    mac_key: bytes | None = field(default=None, repr=False)
    prior_mac_key: bytes | None = field(default=None, repr=False)


def parse_servers(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a sequence of them) as (host, port) pairs; an IPv6 host
    in brackets, as ``lease-server --listen`` takes it (``[::1]:7070``).

    Raises:
        InvalidServerList: an item is not ``HOST:PORT``, or there is none.
    """
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[tuple[str, int]] = []
    for item in (s.strip() for s in items):
        host, sep, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidServerList(f"lease server {item!r} is not HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise InvalidServerList("give at least one lease server as HOST:PORT")
    return out


class _Broken(Exception):
    pass


@dataclass(eq=False, repr=False)
class LeaseClient:
    """Talks to one of several lease servers, failing over and retrying retriable errors.

    Args:
        servers: ``"host:port,host:port"`` or a sequence of ``"host:port"``.
        connect_timeout_s: TCP connect timeout per attempt.
        request_timeout_s: wait for one reply.
        retries: extra attempts after the first, each on the next server.
        backoff_s: first backoff; doubles per retry (capped at 2 s).
        sleep: sleep function (injected in tests).
        clock: monotonic seconds (injected in tests).
        token: auth token sent in ``hello`` on every new connection (servers with
            ``--auth-tokens``). Read it from a file or the environment, never a command line.
        tls: client-side TLS context (``ssl.create_default_context(cafile=...)``; load a
            client certificate into it for mutual TLS).
        rate_limited_wait_s: a RATE_LIMITED answer is retried on the same server after the wait
            it names, without counting as a retry, until the waits of one call pass this.
    """

    servers: str | Sequence[str]
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 5.0
    retries: int = 5
    backoff_s: float = 0.1
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    _: KW_ONLY
    token: str | None = None
    tls: ssl.SSLContext | None = None
    rate_limited_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise InvalidServerList(f"retries must be >= 0, got {self.retries}")
        self._addresses = parse_servers(self.servers)
        self._index = 0
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)

    # -- public ---------------------------------------------------------------------------------

    def lease(
        self, partitions: Sequence[tuple[str, int]] = (), *, key: bytes | None = None
    ) -> Lease:
        """Lease a new pid.

        Args:
            partitions: the partitions it will write (informational).
            key: the producer's raw Ed25519 public key (32 bytes) for this lease: a signing
                server answers with a version 2 ``cert`` naming it.

        Raises:
            LeaseCapacityExhausted, LeaseServiceUnavailable, LeaseServerUnreachable, LeaseError.
        """
        return _lease(
            self._call("lease", partitions=[[t, p] for t, p in partitions], **_key_field(key))
        )

    def bump(
        self,
        pid: int,
        generation: int,
        secret: bytes,
        *,
        token: str | None = None,
        key: bytes | None = None,
    ) -> Lease:
        """Move ``pid`` from ``generation`` (the caller's current one) to a new generation.

        Retries reuse one token (``token``, or a fresh one), so a bump whose reply was lost is
        answered, not refused.

        Args:
            pid: the pid.
            generation: the caller's current generation of it.
            secret: the pid's secret, or that of the pid rolled into it (lineage authority).
            token: idempotency token; pass the same one to repeat a bump whose outcome is
                unknown.
            key: the producer's raw Ed25519 public key for the new generation's ``cert``.

        Raises:
            StaleGeneration: another caller moved the pid on, or it was retired by a roll
                (``successor`` says into which pid): this caller is fenced.
            NotOwner: wrong secret, or no such pid (indistinguishable on purpose).
            UnknownPid: the pid's lease ended (roll it to continue its lineage).
            RateLimited, LeaseServiceUnavailable, LeaseServerUnreachable: retriable.
        """
        return self._change("bump", pid, generation, secret, token, key)

    def roll(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """Retire ``pid`` at ``generation`` (its current one) and lease its successor.

        Compare-and-set on the pid's generation: of two callers rolling (or bumping) from one
        generation only one succeeds. Retries reuse one token, so a roll whose reply was lost
        is answered with the same successor.

        Args:
            pid: the pid to retire.
            generation: its current generation.
            secret: its secret (or its predecessor's).
            key: the producer's raw Ed25519 public key for the successor's ``cert``.

        Returns:
            The successor's lease (a new pid with its own secret and cert).

        Raises:
            StaleGeneration: the pid moved on or was already rolled (``successor`` set).
            NotOwner: wrong secret, or no such pid.
            RateLimited, LeaseServiceUnavailable, LeaseServerUnreachable: retriable.
        """
        return self._change("roll", pid, generation, secret, None, key)

    def _change(
        self,
        op: str,
        pid: int,
        generation: int,
        secret: bytes,
        token: str | None,
        key: bytes | None,
    ) -> Lease:
        """A bump or a roll: one token for all its retries, so a lost reply is answered."""
        fields = {"pid": pid, "generation": generation, "secret": bytes(secret)}
        return _lease(self._call(op, **fields, token=token or uuid.uuid4().hex, **_key_field(key)))

    def describe(self, pid: int) -> PidStatus:
        """What the lease authority knows of ``pid``: its current generation, its lease end and
        whether it is live, retired (rolled) or ended. Read-only: no secret is sent or revealed.

        A server knows every pid that was bumped or rolled (ZooKeeper) and the pids it issued
        itself; an ``unknown`` answer is asked again of each other server in the list.

        Raises:
            RateLimited, LeaseServiceUnavailable, LeaseServerUnreachable: retriable.
            Unauthenticated: the token was refused.
        """
        status = _status(self._call("describe", pid=pid), pid)
        for _ in range(len(self._addresses) - 1):
            if status.known:
                break
            self._failover()
            status = _status(self._call("describe", pid=pid), pid)
        return status

    def ping(self) -> dict[str, Any]:
        """The server's ``server`` id, ``now_ms``, status and lease ``lifetime_ms`` (those two
        only once authenticated)."""
        reply = self._call("ping")
        return {k: v for k, v in reply.items() if k not in ("v", "id", "error")}

    def close(self) -> None:
        """Close the connection (the client can still be used; it reconnects)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> LeaseClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        request_id = next(self._ids)
        frame = encode_frame({"v": PROTOCOL_VERSION, "op": op, "id": request_id, **fields})
        tried: list[str] = []
        last: Exception | None = None
        attempt = 0
        told_to_wait = 0.0
        while attempt <= self.retries:
            if isinstance(last, RateLimited):
                self.sleep(last.retry_after_ms / 1000)  # the server said when
            elif attempt:
                self.sleep(min(self.backoff_s * 2 ** (attempt - 1), 2.0))
            host, port = self._addresses[self._index]
            tried.append(f"{host}:{port}")
            try:
                reply = self._exchange(frame, request_id)
            except _Broken as exc:
                last = exc
                attempt += 1
                self._failover()
                continue
            code = reply.get("error")
            if code is None:
                return reply
            error = error_from_reply(str(code), str(reply.get("message", "")), reply)
            if not error.retriable:
                raise error
            last = error
            if isinstance(error, RateLimited):
                # A healthy server asked for a pause: waited as told on the same server, and
                # not an attempt, until the waits would pass ``rate_limited_wait_s``.
                told_to_wait += error.retry_after_ms / 1000
                if told_to_wait > self.rate_limited_wait_s:
                    raise error
                continue
            attempt += 1
            self._failover()
        if isinstance(last, LeaseServiceUnavailable):
            raise last
        names = ", ".join(dict.fromkeys(tried))
        if self.tls is None and any(_speaks_tls(a, self.connect_timeout_s) for a in tried):
            raise LeaseTlsMismatch(
                f"the lease server at {names} wants TLS and this client has none: give it "
                f"the server's CA (${TLS_CA_ENV}, LeaseClient(tls=client_tls_context(CA)), or "
                "--tls-ca of lease-ping)"
            )
        raise LeaseServerUnreachable(
            f"no lease server answered {op!r} after {self.retries + 1} attempts (tried {names}; "
            f"last error: {last}); start one with `pidfence lease-server --zk HOSTS --listen "
            "HOST:PORT` or fix the server list"
        )

    def _failover(self) -> None:
        self.close()
        self._index = (self._index + 1) % len(self._addresses)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            host, port = self._addresses[self._index]
            try:
                sock = socket.create_connection((host, port), timeout=self.connect_timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    name = host if self.tls.check_hostname else None
                    sock = self.tls.wrap_socket(sock, server_hostname=name)
            except ssl.SSLError as exc:
                if isinstance(exc, ssl.SSLCertVerificationError) or "WRONG_VERSION" in str(exc):
                    raise LeaseTlsMismatch(
                        f"TLS handshake with the lease server {host}:{port} failed ({exc}): "
                        f"give the client the CA that signed its --tls-cert (${TLS_CA_ENV}, "
                        "LeaseClient(tls=client_tls_context(CA)), or --tls-ca of lease-ping), "
                        "or drop TLS on the client if the server has no --tls-cert"
                    ) from None
                raise _Broken(f"connect to {host}:{port} failed: {exc}") from exc
            except OSError as exc:
                raise _Broken(f"connect to {host}:{port} failed: {exc}") from exc
            self._sock = sock
            if self.token is not None:
                self._hello(sock)
        return self._sock

    def _hello(self, sock: socket.socket) -> None:
        request_id = next(self._ids)
        frame = encode_frame(
            {"v": PROTOCOL_VERSION, "op": "hello", "id": request_id, "token": self.token}
        )
        reply = self._exchange_on(sock, frame, request_id)
        code = reply.get("error")
        if code is not None:
            self.close()
            if code == Unauthenticated.code:
                raise Unauthenticated(
                    f"lease server refused the auth token: {reply.get('message', '')}; "
                    f"check the client's token (${TOKEN_FILE_ENV} or LeaseClient(token=))"
                )
            error = error_from_reply(str(code), str(reply.get("message", "")), reply)
            if error.retriable:
                raise _Broken(str(error))  # e.g. connection limit: try the next server
            raise error

    def _exchange(self, frame: bytes, request_id: int) -> dict[str, Any]:
        return self._exchange_on(self._connect(), frame, request_id)

    def _exchange_on(self, sock: socket.socket, frame: bytes, request_id: int) -> dict[str, Any]:
        deadline = self.clock() + self.request_timeout_s
        try:
            sock.settimeout(self.request_timeout_s)
            sock.sendall(frame)
            while True:
                reply = self._read_reply(sock, deadline)
                if reply.get("id") == request_id:
                    return reply
                if reply.get("id") is None and reply.get("error"):
                    return reply  # the server refused the connection or the frame as a whole
        except (OSError, _Broken) as exc:
            self.close()
            raise _Broken(str(exc)) from exc

    def _read_reply(self, sock: socket.socket, deadline: float) -> dict[str, Any]:
        (length,) = LENGTH.unpack(self._read_exactly(sock, 4, deadline))
        if length > MAX_FRAME_BYTES:
            raise _Broken(f"reply frame of {length} bytes; not a lease server?")
        try:
            reply = msgpack.unpackb(self._read_exactly(sock, length, deadline), raw=False)
        except Exception as exc:
            raise _Broken(f"undecodable reply: {exc}") from exc
        if not isinstance(reply, dict):
            raise _Broken("reply is not a msgpack map")
        return reply

    def _read_exactly(self, sock: socket.socket, n: int, deadline: float) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise _Broken("request timed out")
            sock.settimeout(remaining)
            chunk = sock.recv(n - len(chunks))
            if not chunk:
                raise _Broken("connection closed by the server")
            chunks += chunk
        return bytes(chunks)


def _speaks_tls(address: str, timeout_s: float) -> bool:
    """Whether ``HOST:PORT`` completes a TLS handshake (its certificate not checked): asked only
    after a plain client's connections were closed without a reply."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw),
        ):
            return True
    except (OSError, ValueError):
        return False


def _key_field(key: bytes | None) -> dict[str, bytes]:
    return {} if key is None else {"key": bytes(key)}


def _status(reply: dict[str, Any], pid: int) -> PidStatus:
    try:
        state = PidState(str(reply["state"]))
        return PidStatus(pid, state, int(reply["generation"]), int(reply["expire_ms"]))
    except (KeyError, TypeError, ValueError):
        return PidStatus.unknown(pid)  # an answer it cannot read vouches for nothing


def _lease(reply: dict[str, Any]) -> Lease:
    secret = reply.get("secret")
    cert = reply.get("cert")
    mac_key = reply.get("mac_key")
    prior = reply.get("prior_mac_key")
    return Lease(
        reply["pid"],
        reply["generation"],
        reply.get("sequence", 0),
        reply["expire_ms"],
        secret if isinstance(secret, bytes) else b"",
        cert if isinstance(cert, bytes) else None,
        mac_key if isinstance(mac_key, bytes) else None,
        prior if isinstance(prior, bytes) else None,
    )
