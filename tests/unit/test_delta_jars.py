"""The ``delta`` jar component: delta-spark for the Spark version pyspark pins, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from pidfence.services.jars import COMPONENTS, is_fresh, jars

ROOT = Path(__file__).resolve().parents[2]


def _property(pom: str, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
    assert match, name
    return match.group(1)


def test_delta_module_pins_the_release_built_for_the_pinned_spark() -> None:
    parent = (ROOT / "infra" / "jvm" / "pom.xml").read_text()
    assert "<module>delta</module>" in parent and "delta" in COMPONENTS
    # delta-spark 4.4.x is built against Spark 4.2.0 (4.2.x/4.3.x: Spark 4.1, 4.0.x: Spark 4.0).
    assert _property(parent, "spark.version") == "4.2.0"
    assert _property(parent, "delta.version") == "4.4.0"
    module = (ROOT / "infra" / "jvm" / "delta" / "pom.xml").read_text()
    assert "delta-spark_2.13" in module and "delta-storage" in module


def test_the_cache_holds_exactly_delta_spark_and_delta_storage() -> None:
    if not is_fresh():
        return  # `make setup` fills it; services tests report a stale cache
    names = sorted(p.name for p in jars("delta"))
    assert names == ["delta-spark_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"]
