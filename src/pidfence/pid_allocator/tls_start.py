"""Starting TLS on an accepted connection from inside ``connection_made``.

The lease server accepts plain TCP and starts TLS per connection (so a connection counts from its
first byte, ``admission.py``). ``loop.start_tls`` hands the socket to the TLS layer in its
synchronous first step; run as a task, that step would come a loop turn later, and uvloop starts
reading a transport right after ``connection_made`` returns, so a ClientHello could reach the
lease protocol as a frame. :class:`TlsStart` therefore steps the coroutine by hand, as a task
would (``send`` until it yields a future, again when that future is done), starting in the
caller's own call; :meth:`TlsStart.cancel` throws into it, as a task's cancel does.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from typing import Any


class TlsStart:
    """The server side of one TLS handshake on ``raw``, run now.

    Args:
        loop: the running loop.
        raw: the accepted TCP transport.
        protocol: the protocol the TLS transport will feed.
        context: the server's TLS context.
        timeout_s: handshake deadline.
        started: called with the TLS transport once the handshake is done.
        failed: called when it failed, timed out or was cancelled (``raw`` is aborted already).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        raw: asyncio.Transport,
        protocol: asyncio.BaseProtocol,
        context: ssl.SSLContext,
        timeout_s: float,
        started: Callable[[asyncio.Transport], None],
        failed: Callable[[], None],
    ) -> None:
        self._raw = raw
        self._started = started
        self._failed = failed
        self._step: Coroutine[Any, Any, asyncio.Transport | None] | None = loop.start_tls(
            raw, protocol, context, server_side=True, ssl_handshake_timeout=timeout_s
        )
        self._advance(None)

    @property
    def running(self) -> bool:
        """Whether the handshake is still under way."""
        return self._step is not None

    def cancel(self) -> None:
        """Abandon the handshake (eviction, shutdown)."""
        self._advance(None, asyncio.CancelledError())

    def _advance(self, waited: object, error: BaseException | None = None) -> None:
        step = self._step
        if step is None:
            if isinstance(waited, asyncio.Future) and not waited.cancelled():
                waited.exception()  # an abandoned handshake's failure is expected: retrieved
            return
        try:
            waiting = step.send(None) if error is None else step.throw(error)
        except StopIteration as done:
            self._step = None
            if done.value is None:
                self._raw.abort()
                self._failed()
            else:
                self._started(done.value)
        except BaseException:  # noqa: BLE001 - failed, timed out or cancelled: all end alike
            self._step = None
            self._raw.abort()
            self._failed()
        else:
            waiting.add_done_callback(self._advance)
