"""Which asyncio event loop a lease server runs on: the standard one, or uvloop when installed.

uvloop is an optional dependency (``pip install pidfence[fast]``). ``auto`` takes it when it can
be imported and the standard loop otherwise, so a server never fails to start for lack of it;
``uvloop`` insists (a clear error when absent), ``asyncio`` never uses it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable

from pidfence.pid_allocator.declaration import SettingsError
from pidfence.wire import PidfenceError

#: The values of ``LeaseServerSettings.event_loop`` (``--loop``).
LOOP_CHOICES = ("auto", "asyncio", "uvloop")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


class LoopUnavailable(PidfenceError):
    """``--loop uvloop`` was asked for but uvloop is not installed."""


def uvloop_installed() -> bool:
    """Whether uvloop can be imported."""
    return importlib.util.find_spec("uvloop") is not None


def resolve_loop(choice: str) -> str:
    """``asyncio`` or ``uvloop``: what ``choice`` means on this machine.

    Raises:
        SettingsError: ``choice`` is not one of ``LOOP_CHOICES``.
        LoopUnavailable: ``uvloop`` asked for and not installed.
    """
    if choice not in LOOP_CHOICES:
        raise SettingsError(
            f"event loop (--loop) must be one of {', '.join(LOOP_CHOICES)}, got {choice!r}"
        )
    if choice == "asyncio":
        return "asyncio"
    if uvloop_installed():
        return "uvloop"
    if choice == "uvloop":
        raise LoopUnavailable(
            "--loop uvloop needs uvloop: pip install 'pidfence[fast]' (or use --loop auto)"
        )
    return "asyncio"


def loop_factory(choice: str) -> tuple[LoopFactory, str]:
    """A factory of new event loops for ``choice``, and the resolved loop name.

    Raises:
        SettingsError, LoopUnavailable: as :func:`resolve_loop`.
    """
    resolved = resolve_loop(choice)
    if resolved == "uvloop":
        uvloop = importlib.import_module("uvloop")
        factory: LoopFactory = uvloop.new_event_loop
        return factory, resolved
    return asyncio.new_event_loop, resolved
