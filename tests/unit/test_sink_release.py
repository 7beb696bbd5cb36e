"""A run that ends because its store stopped answering reports the run's failure, not the
store's refusal to take the claim's release (which then lapses)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from pidfence.spark_sink.pipeline import _release


class _DeadStoreClaim:
    def release(self) -> None:
        raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")


def test_a_release_the_store_refuses_is_logged_and_left_to_lapse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _release(cast(Any, _DeadStoreClaim()))
    assert "lapses" in caplog.text and "NETWORK_CONNECTION" in caplog.text
