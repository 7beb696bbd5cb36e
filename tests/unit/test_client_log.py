"""librdkafka's repeated lines reach the log once per window."""

from __future__ import annotations

import logging

from pidfence.producer.client_log import LOGGER_NAME, RepeatFilter, librdkafka_logger

REFUSED = (
    "FAIL [rdkafka#consumer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to "
    "ipv4#127.0.0.1:1 failed: Connection refused (after {ms}ms in state CONNECT)"
)


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord(LOGGER_NAME, logging.ERROR, __file__, 1, text, None, None)


def test_a_line_repeated_at_every_reconnect_passes_once_per_window() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=60.0, clock=lambda: now[0])
    passed = []
    for step in range(150):  # ten seconds of reconnects
        now[0] = step * 0.07
        passed.append(repeats.filter(_record(REFUSED.format(ms=step % 3))))
    assert passed.count(True) == 1
    now[0] = 61.0
    assert repeats.filter(_record(REFUSED.format(ms=0)))  # still failing a minute later: news


def test_distinct_lines_all_pass() -> None:
    repeats = RepeatFilter(clock=lambda: 0.0)
    assert repeats.filter(_record("FAIL a: Connection refused"))
    assert repeats.filter(_record("FAIL b: Connection refused"))
    assert not repeats.filter(_record("FAIL a: Connection refused"))


def test_the_clients_logger_carries_one_filter() -> None:
    logger = librdkafka_logger()
    assert librdkafka_logger() is logger
    assert sum(isinstance(f, RepeatFilter) for f in logger.filters) == 1
