"""How one lease-server setting is declared: the option that names it, its help and its bounds,
kept as the metadata of its :class:`~pidfence.pid_allocator.settings.LeaseServerSettings` field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.wire import PidfenceError


class SettingsError(PidfenceError):
    """A lease-server setting is invalid or a combination of settings cannot work (exit 2)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How the user names and sees one setting (the metadata of its field).

    Attributes:
        option: the option without dashes (``lifetime``): flag ``--lifetime``, variable
            ``PIDFENCE_LEASE_SERVER_LIFETIME``, settings file key ``lifetime``.
        help: what it means (``--help`` and the docs table).
        kind: how its text is read: ``text``, ``int``, ``float``, ``path``, ``flag``, ``ms``
            (a duration, in ms), ``seconds`` (a duration, in seconds) or ``listen``
            (``HOST:PORT``, which sets ``host`` and ``port``).
        low, high: the smallest and largest allowed value; ``above``: the value must be greater.
        choices: the allowed values of a text setting.
        unset: what an unset (None or false) value means, as the docs say it.
        field: the field it sets (filled in by :func:`declared`).
    """

    option: str
    help: str
    kind: str = "text"
    low: float | None = None
    high: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()
    unset: str = "off"
    field: str = ""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is out of this setting's bounds, or None."""
        if value is None or isinstance(value, bool | Path):
            return None
        if self.choices:
            if value in self.choices:
                return None
            allowed = ", ".join(self.choices)
            return f"{self.field} (--{self.option}) must be {allowed}, got {value!r}"
        low, above, high = self.low, self.above, self.high
        if (
            (low is None or value >= low)
            and (above is None or value > above)
            and (high is None or value <= high)
        ):
            return None
        if above is not None:
            bounds = f"> {above:g}" if high is None else f"in ({above:g}, {high:g}]"
        else:
            bounds = f">= {low:g}" if high is None else f"{low:g}..{high:g}"
        return f"{self.field} must be {bounds}, got {value}"


def setting(default: Any, option: str, help: str, **details: Any) -> Any:
    """A settings field: its ``default`` and its :class:`Setting` (``details`` as there)."""
    return field(default=default, metadata={"setting": Setting(option, help, **details)})


__all__ = ["Setting", "SettingsError", "setting"]
