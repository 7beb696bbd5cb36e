"""Is anything listening there? A refused connect is an answer, so it needs no full timeout.

A client library asked to reach a server nobody runs keeps reconnecting until its own timeout (10
to 15 s for librdkafka's metadata request and kazoo's session start). When every address of the
list refuses the TCP connect for :data:`REFUSED_GRACE_S`, nothing listens there and the caller can
say so at once; the grace covers a server that is binding its port just now. Any other outcome is
left to the client, at its own timeout.

Kept outside the layers (it imports nothing of pidfence), so that the commands' preflight and the
lease server's ZooKeeper start share one definition.
"""

from __future__ import annotations

import socket
import time

#: How long every address must keep refusing before nothing counts as listening.
REFUSED_GRACE_S = 3.0
#: One connect attempt's timeout: a refusal comes back at once, so this only bounds the odd case.
CONNECT_TIMEOUT_S = 1.0


def parse_address(entry: str) -> tuple[str, int] | None:
    """``host:port`` (also ``[v6]:port`` and ``PROTOCOL://host:port``), None if not one."""
    host, _, port = entry.strip().rpartition("://")[2].rpartition(":")
    host = host.strip("[]")
    return (host, int(port)) if host and port.isdigit() else None


def zookeeper_servers(connect: str) -> str:
    """A ZooKeeper connect string's server list, without its chroot (``h1:2181,h2:2181/app``)."""
    return connect.split("/", 1)[0]


def refused_everywhere(servers: str, grace_s: float = REFUSED_GRACE_S) -> bool:
    """True when every address of a comma-separated list refused every TCP connect for
    ``grace_s``. Any other outcome (a connect, a timeout, a name that does not resolve, an entry
    that is not ``host:port``) is False: the client's own request then decides, at its timeout.
    """
    parsed = [parse_address(entry) for entry in servers.split(",") if entry.strip()]
    addresses = [address for address in parsed if address is not None]
    if not parsed or len(addresses) != len(parsed):
        return False
    deadline = time.monotonic() + grace_s
    while True:
        for address in addresses:
            try:
                with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S):
                    return False
            except ConnectionRefusedError:
                continue
            except OSError:
                return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.25)
