"""Free TCP ports on 127.0.0.1, never handed out twice at once on this machine."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import tempfile
import threading
import time
from pathlib import Path

#: Ports already handed out by this process: the kernel may offer a just-closed ephemeral port
#: again at once, and a node's client and controller ports must never coincide.
_GIVEN: set[int] = set()
_LOCK = threading.Lock()
#: Ports handed out by any process on the machine (parallel test workers, other test runs), with
#: when: a port is free from its hand-out until its server binds it, and another process asking
#: the kernel in that window could get the same one.
REGISTRY = Path(tempfile.gettempdir()) / "pidfence-ports"
#: How long a hand-out holds its port: far longer than any server takes to bind it.
HOLD_S = 600.0


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now and no process here handed out."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        with _LOCK:
            if port not in _GIVEN and _claim(port):
                _GIVEN.add(port)
                return port


def _claim(port: int, now: float | None = None, registry: Path = REGISTRY) -> bool:
    """Record ``port`` in the machine's ``registry``; False when another process holds it.

    A registry that cannot be written (a read-only temp folder) claims nothing and refuses
    nothing: the process-local check still holds.
    """
    now = time.time() if now is None else now
    try:
        with registry.open("a+", encoding="ascii") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            held: dict[int, float] = {}
            for line in handle.read().split():
                with contextlib.suppress(ValueError):
                    given, _, when = line.partition("@")
                    if now - float(when) < HOLD_S:
                        held[int(given)] = float(when)
            if port in held:
                return False
            held[port] = now
            handle.seek(0)
            handle.truncate()
            handle.write("".join(f"{p}@{w:.0f}\n" for p, w in held.items()))
    except OSError:
        return True
    return True
