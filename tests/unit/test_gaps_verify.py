"""``verify`` names upstream gaps apart: information, unless an acknowledged record is inside."""

from __future__ import annotations

from pidfence.spark_sink.gaps import GapReport, gaps_table
from pidfence.verify import check
from tests.unit.test_verify_check import PID, TOPIC, log_table, rec, rejects_table, sent


def test_a_gap_of_records_nobody_acknowledged_is_information() -> None:
    # Seq 2 never reached Kafka (nobody acknowledged it); the sink reported the gap.
    log = log_table([rec(0, 0), rec(1, 1), rec(3, 2)])
    gaps = gaps_table([(TOPIC, 0, 4, GapReport("lost", PID, 3, 2, 2, 1, 2))])
    report = check([sent(0, 0), sent(1, 1), sent(3, 2)], log, rejects_table([]), gaps=gaps)
    assert report.ok
    found = report.findings["upstream_gap"]
    assert found.count == 1
    assert found.examples[0]["kind"] == "lost" and found.examples[0]["acknowledged_inside"] == 0


def test_an_acknowledged_record_inside_a_gap_is_still_lost_and_names_the_gap() -> None:
    log = log_table([rec(0, 0), rec(3, 2)])
    gaps = gaps_table([(TOPIC, 0, 4, GapReport("lost", PID, 3, 1, 2, 0, 2))])
    report = check([sent(0, 0), sent(1, 1), sent(3, 2)], log, rejects_table([]), gaps=gaps)
    assert not report.ok
    assert report.findings["lost"].count == 1
    assert report.findings["lost"].examples[0]["in_gap"] == "lost seq 1..2"
    assert report.findings["upstream_gap"].examples[0]["acknowledged_inside"] == 1


def test_offsets_gaps_are_listed_too() -> None:
    gaps = gaps_table([(TOPIC, 0, 0, GapReport("offsets", offset_after=50))])
    report = check([], log_table([]), rejects_table([]), gaps=gaps)
    assert report.ok
    assert report.findings["upstream_gap"].examples == [
        {"topic": TOPIC, "partition": 0, "batch": 0, "kind": "offsets", "offset_after": 50}
    ]
