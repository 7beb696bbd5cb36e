"""``register()`` may be called more than once: a second registration of the same source is
harmless (the soak's drain process met ``DATA_SOURCE_ALREADY_EXISTS`` and failed at start)."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.spark_sink import register

pytestmark = pytest.mark.integration


def test_register_twice_is_harmless(spark: Any) -> None:
    register(spark)
    register(spark)  # raised DATA_SOURCE_ALREADY_EXISTS where the JVM already knew the source
