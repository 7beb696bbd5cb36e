"""The logger librdkafka's own lines go to, one line per distinct failure.

librdkafka logs a broker's connect failure at every reconnect (every 100 ms at first), so a copier
waiting ten seconds for a Kafka that is down printed some 150 identical ``FAIL`` lines before its
one-line verdict. Its lines are passed on to the ``pidfence.producer.librdkafka`` logger once per
distinct text per :data:`REPEAT_WINDOW_S`; the text's timing suffix ("after 0ms in state
CONNECT") does not make a line distinct.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

LOGGER_NAME = "pidfence.producer.librdkafka"
#: A repeated line is shown again after this long: a failure that persists is still news.
REPEAT_WINDOW_S = 60.0
#: Distinct lines remembered; the oldest are forgotten first.
MAX_REMEMBERED = 256
_TIMING = re.compile(r"\s*\(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)")


class RepeatFilter(logging.Filter):
    """Pass a record only if the same text was not passed within ``window_s``.

    Args:
        window_s: how long a passed text is held back.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # librdkafka logs from its own threads

    def filter(self, record: logging.LogRecord) -> bool:
        """True for a line not seen within the window."""
        text = _TIMING.sub("", record.getMessage())
        now = self._clock()
        with self._lock:
            seen = self._last.get(text)
            if seen is not None and now - seen < self._window_s:
                return False
            self._last.pop(text, None)
            self._last[text] = now
            while len(self._last) > MAX_REMEMBERED:
                del self._last[next(iter(self._last))]
        return True


_REPEATS = RepeatFilter()


def librdkafka_logger() -> logging.Logger:
    """The ``logger`` for a confluent-kafka client: repeated lines dropped (module docstring)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.addFilter(_REPEATS)  # a no-op when it is already there
    return logger
