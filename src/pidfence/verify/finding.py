"""One finding of the checker: a count and the first few cases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

#: How many examples each finding keeps.
MAX_EXAMPLES: Final = 10


@dataclass(slots=True)
class Finding:
    """One anomaly's total and the first few cases (plain dicts, ready for JSON)."""

    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, example: dict[str, Any]) -> None:
        """Count one case and keep it when fewer than ``MAX_EXAMPLES`` are kept."""
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)


__all__ = ["MAX_EXAMPLES", "Finding"]
