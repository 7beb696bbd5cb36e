"""The driver's accumulator server: no traceback when the JVM closes its connection first."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.services.spark import _quiet_accumulator_eof


class FakeServer:
    def __init__(self) -> None:
        self.printed: list[str] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.printed.append("traceback")


class FakeContext:
    def __init__(self) -> None:
        self._accumulatorServer = FakeServer()


def _fail_with(exc: Exception, server: FakeServer) -> None:
    try:
        raise exc
    except type(exc):
        server.handle_error(None, ("127.0.0.1", 1))


def test_an_eof_from_the_jvm_prints_nothing() -> None:
    context = FakeContext()
    _quiet_accumulator_eof(context)
    _fail_with(EOFError(), context._accumulatorServer)
    assert context._accumulatorServer.printed == []


@pytest.mark.parametrize("exc", [ValueError("bad token"), OSError("reset")])
def test_any_other_error_is_still_printed(exc: Exception) -> None:
    context = FakeContext()
    _quiet_accumulator_eof(context)
    _quiet_accumulator_eof(context)  # a second session on the same context wraps once
    _fail_with(exc, context._accumulatorServer)
    assert context._accumulatorServer.printed == ["traceback"]


def test_a_context_without_a_server_is_left_alone() -> None:
    _quiet_accumulator_eof(object())
