"""Shopify's toxiproxy, a TCP fault proxy: the server process and a small client for its API.

``make setup`` builds the server into ``.cache/bin/toxiproxy-server`` when ``go`` is installed.
:class:`ToxiproxyServer` runs it on a free 127.0.0.1 port; :class:`Toxiproxy` talks to its HTTP
API (proxies, toxics, reset) with the standard library. A :class:`Proxy` listens on its own port
and forwards to its upstream; toxics on it add latency, drop data one way, reset connections, limit
bandwidth or slice the stream, on the ``upstream`` (client to server) or ``downstream`` direction.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess, wait_until
from pidfence.wire import PidfenceError

#: The binary ``make setup`` builds (``go install .../toxiproxy/v2/cmd/server@v2.12.0``).
BINARY = "toxiproxy-server"
VERSION = "v2.12.0"


class ToxiproxyError(PidfenceError):
    """The fault proxy refused a request or did not answer; the message says which."""

    retriable: ClassVar[bool] = False


class ToxiproxyMissing(ToxiproxyError):
    """The toxiproxy server is not built: run ``make setup`` with ``go`` installed."""


def toxiproxy_binary() -> Path | None:
    """The toxiproxy server: ``.cache/bin/toxiproxy-server`` of the checkout ``make setup`` ran
    in (the current folder or one above it, or the checkout of an editable install), else on
    PATH."""
    for base in (Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[3]):
        if (built := base / ".cache" / "bin" / BINARY).is_file():
            return built
    found = shutil.which(BINARY)
    return Path(found) if found else None


def missing_reason() -> str | None:
    """None when the server is there, else one line saying why not and how to get it."""
    if toxiproxy_binary() is not None:
        return None
    go = "go is installed" if shutil.which("go") else "go is not installed"
    return (
        f"toxiproxy is not built ({go}): network faults need {BINARY}; run `make setup` with go "
        f"installed (it builds toxiproxy {VERSION} into .cache/bin/)"
    )


class Toxiproxy:
    """A client of one toxiproxy server's HTTP API.

    Args:
        address: ``host:port`` of the API.
        timeout_s: per request.
    """

    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self.address = address
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.address}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310
                text = reply.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(
                f"toxiproxy {self.address}: {method} {path} refused ({exc.code}): {detail}"
            ) from exc
        except OSError as exc:
            raise ToxiproxyError(
                f"toxiproxy {self.address}: {method} {path} failed ({exc}); is the server up?"
            ) from exc
        return json.loads(text) if text.strip() else None

    def version(self) -> str:
        """The server's version (a cheap readiness probe)."""
        request = urllib.request.Request(f"http://{self.address}/version")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310
                return str(reply.read().decode().strip())
        except OSError as exc:
            raise ToxiproxyError(f"toxiproxy {self.address} does not answer ({exc})") from exc

    def create_proxy(self, name: str, upstream: str, listen_port: int | None = None) -> Proxy:
        """A new proxy listening on 127.0.0.1 (a free port unless given) forwarding to
        ``upstream`` (``host:port``)."""
        port = listen_port or free_port()
        self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream, "enabled": True},
        )
        return Proxy(self, name, port, upstream)

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")


@dataclass(frozen=True)
class Proxy:
    """One proxy: ``127.0.0.1:port`` forwarding to ``upstream``."""

    client: Toxiproxy
    name: str
    port: int
    upstream: str

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``: what clients connect to instead of the upstream."""
        return f"127.0.0.1:{self.port}"

    def add_toxic(
        self,
        name: str,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> None:
        """Add a toxic (``latency``, ``timeout``, ``reset_peer``, ``bandwidth``, ``slicer``...)."""
        self.client._call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )

    def remove_toxic(self, name: str) -> None:
        """Remove one toxic. What a ``timeout`` toxic dropped meanwhile stays lost (toxiproxy
        drops the data; it does not hold it back)."""
        self.client._call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def delete(self) -> None:
        """Remove the proxy (its port closes)."""
        self.client._call("DELETE", f"/proxies/{self.name}")


class ToxiproxyServer:
    """A toxiproxy server process on a free 127.0.0.1 port, stopped by pid.

    Args:
        log_dir: where ``toxiproxy.log`` goes.
        name: the process's name (and log file's).

    Raises:
        ToxiproxyMissing: the binary is not built.
    """

    def __init__(self, log_dir: Path, name: str = "toxiproxy") -> None:
        binary = toxiproxy_binary()
        if binary is None:
            raise ToxiproxyMissing(missing_reason() or BINARY)
        self.port = free_port()
        argv = [str(binary), "-host", "127.0.0.1", "-port", str(self.port)]
        self.proc = ManagedProcess(name, argv, log_dir / f"{name}.log")
        self.client = Toxiproxy(f"127.0.0.1:{self.port}")

    def start(self, timeout: float = 30.0) -> ToxiproxyServer:
        """Start it; return once its API answers."""
        self.proc.start()
        wait_until(
            self.client.version,
            timeout,
            f"toxiproxy on {self.client.address}",
            tail=self.proc.log_tail(),
        )
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        self.proc.stop(10)

    @property
    def pid(self) -> int | None:
        """The process id while running."""
        return self.proc.pid
