"""The JVM options every service pidfence starts takes from ``PIDFENCE_JVM_OPTIONS``."""

from __future__ import annotations

import pytest

from pidfence.services.process import JVM_OPTIONS_ENV, jvm_options

G1 = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")


def test_without_the_variable_a_service_keeps_its_own_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    assert jvm_options(G1) == list(G1)
    monkeypatch.setenv(JVM_OPTIONS_ENV, "")
    assert jvm_options(G1) == list(G1)


def test_options_are_added_and_a_collector_chosen_there_replaces_the_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(JVM_OPTIONS_ENV, "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    # Two collectors would stop the JVM from starting ("Conflicting collector combinations").
    assert jvm_options(G1) == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    monkeypatch.setenv(JVM_OPTIONS_ENV, "-Xss2m '-Dname=a b'")
    assert jvm_options(G1) == [*G1, "-Xss2m", "-Dname=a b"]
