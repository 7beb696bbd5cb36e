"""Offsets Kafka deleted before the sink read them: which ranges are lost, and how it is said."""

from __future__ import annotations

import pytest

from pidfence.spark_sink.data_loss import LostRange, data_lost, lost_ranges


def test_only_offsets_below_the_log_start_are_lost() -> None:
    watermarks = {("t", 0): (10, 50), ("t", 1): (10, 50), ("t", 2): (0, 5)}
    # t[0] continues exactly at the log start, t[1] three offsets below it was deleted up to 9,
    # and t[2] has no checkpointed start: nothing to lose there.
    starts = {("t", 0): 10, ("t", 1): 3}
    assert lost_ranges(starts, watermarks) == [LostRange("t", 1, 3, 9)]


@pytest.mark.parametrize(("partitions", "more"), [(5, ""), (6, " and 1 more partitions")])
def test_the_error_names_five_ranges_and_counts_the_rest(partitions: int, more: str) -> None:
    message = str(data_lost([LostRange("t", p, 0, 9) for p in range(partitions)]))
    shown = ", ".join(f"t[{p}] offsets 0..9" for p in range(5))
    assert f"({shown}{more}: retention ran" in message
    assert "--allow-data-loss" in message
