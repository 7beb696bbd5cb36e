"""A Kafka record as confluent-kafka's ``Message`` shows it, for the unit tier's fakes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass
class Message:
    """A consumed record or a delivery report (``headers=None``: reports carry none)."""

    topic_: str
    partition_: int
    offset_: int = -1
    key_: Any = None
    value_: Any = None
    headers_: Any = None

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> Any:
        return self.key_

    def value(self) -> Any:
        return self.value_

    def headers(self) -> Any:
        return None if self.headers_ is None else list(self.headers_)

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self.offset_)

    def report(self) -> Message:
        """This record's delivery report."""
        return replace(self, headers_=None)
