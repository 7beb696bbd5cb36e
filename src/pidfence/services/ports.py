"""Free TCP ports on 127.0.0.1."""

from __future__ import annotations

import socket
import threading

#: Ports already handed out by this process: the kernel may offer a just-closed ephemeral port
#: again at once, and a node's client and controller ports must never coincide.
_GIVEN: set[int] = set()
_LOCK = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now and this process never handed out."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        with _LOCK:
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
