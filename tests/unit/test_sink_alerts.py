"""The alert rules (``docs/alerts/``) and the Grafana dashboard (``docs/dashboards/``) ask for
metrics that exist.

Every expression is parsed by a PromQL parser (``promql-parser``, Prometheus' grammar), and
every metric it selects must be a family of a real scrape of the sink's and the lease server's
collectors; ``promtool`` checks the rules and runs their unit tests as well (``make setup`` builds
it into ``.cache/bin`` when ``go`` is installed; else one on the PATH). The
integration test ``test_sink_metrics.py`` checks the same names against running processes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pidfence.pid_allocator.metrics import ServerMetrics
from pidfence.spark_sink.metrics import SinkMetrics
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import open_output
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.unit.test_sink_metrics import QUERY, FakeKafka, two_partitions, write_task

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Prometheus' rule checker: the checkout's own build, else one on the PATH (None: neither).
BUILT_PROMTOOL = ROOT / ".cache" / "bin" / "promtool"
PROMTOOL = str(BUILT_PROMTOOL) if BUILT_PROMTOOL.is_file() else shutil.which("promtool")
NO_PROMTOOL = "promtool (Prometheus) neither built by make setup (needs go) nor on the PATH"
RULES = sorted(p for p in (DOCS / "alerts").glob("*.yml") if not p.name.endswith(".test.yml"))
DASHBOARDS = sorted((DOCS / "dashboards").glob("*.json"))
#: Grafana's variables, as Grafana substitutes them before Prometheus sees a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
#: Series Prometheus itself records for each scrape target, served by no process.
SCRAPE_SERIES = frozenset({"up"})
#: What prometheus_client adds to a family's name for its samples.
SUFFIXES = re.compile(r"_(total|bucket|count|sum|created)$")


def selected_metrics(expr: str) -> set[str]:
    """The metric names an expression selects (raises ValueError when it does not parse)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return names


def selected_by(node: Any) -> set[str]:
    """The metric names a parsed (sub)expression selects."""
    names: set[str] = set()

    def visit(found: Any) -> None:
        if isinstance(found, promql_parser.VectorSelector) and found.name:
            names.add(found.name)

    promql_parser.walk(node, pre_visit=visit)
    return names


def groups() -> dict[str, dict[str, str]]:
    """Group name -> (alert name -> expression), of every rule file."""
    found: dict[str, dict[str, str]] = {}
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.setdefault(group["name"], {}).update(
                {rule["alert"]: rule["expr"] for rule in group["rules"]}
            )
    return found


def rule_exprs() -> dict[str, str]:
    """Alert name -> expression, of every rule file."""
    found = {}
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found[rule["alert"]] = rule["expr"]
    return found


def dashboard_exprs() -> dict[str, str]:
    """``panel title / refId`` -> expression, of every dashboard."""
    found = {}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found[f"{panel['title']} / {target['refId']}"] = target["expr"]
    return found


def families(text: str) -> set[str]:
    """The metric family names of a scrape (text format)."""
    return {f.name for f in text_string_to_metric_families(text)}


def missing_from(scraped: set[str]) -> dict[str, set[str]]:
    """Per rule or panel, the metrics it selects that no scraped family provides."""
    wanted = {**rule_exprs(), **dashboard_exprs()}
    missing = {}
    for where, expr in wanted.items():
        gone = {
            n for n in selected_metrics(expr) - SCRAPE_SERIES if SUFFIXES.sub("", n) not in scraped
        }
        if gone:
            missing[where] = gone
    return missing


def test_every_rule_is_complete_and_parses() -> None:
    assert RULES, "no alert rules under docs/alerts"
    alerts = set()
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                alerts.add(rule["alert"])
                assert rule["labels"]["severity"] in ("page", "warning"), rule
                assert rule["annotations"]["summary"] and rule["annotations"]["description"]
                assert selected_metrics(rule["expr"]), rule["alert"]
    # What the issue asks to be alerted on: stalled, lag growing, fenced or unknown
    # producers, a gap opened.
    assert {
        "PidfenceSinkStalled",
        "PidfenceSinkDown",
        "PidfenceSinkLagGrowing",
        "PidfenceFencedOrUnknownProducers",
        "PidfenceGapOpened",
    } <= alerts


def test_each_components_rules_select_only_the_metrics_that_component_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README promises rules for both; a lease server rule must not lean on the sink's
    metrics, nor the other way round (a metric of the other would never be scraped there)."""
    by_group = groups()
    assert set(by_group) == {"pidfence-sink", "pidfence-lease-server"}
    # What a lease server can be alerted on from what it exports: down, ZooKeeper failing or
    # answering UNAVAILABLE, CAPACITY answers or a ring nearly full, connections refused, a
    # client rate-limited on end.
    assert set(by_group["pidfence-lease-server"]) == {
        "PidfenceLeaseServerDown",
        "PidfenceLeaseServerUnavailable",
        "PidfenceLeaseCapacityExhausted",
        "PidfenceLeaseRingNearlyFull",
        "PidfenceLeaseConnectionsRefused",
        "PidfenceLeaseClientRateLimited",
    }
    served = {
        "pidfence-sink": families(generate_latest(committed_sink(tmp_path, monkeypatch)).decode()),
        "pidfence-lease-server": families(generate_latest(ServerMetrics().registry).decode()),
    }
    for group, rules in by_group.items():
        for alert, expr in rules.items():
            names = selected_metrics(expr)
            foreign = {n for n in names - SCRAPE_SERIES if SUFFIXES.sub("", n) not in served[group]}
            assert foreign == set(), alert
            if "up" in names:  # a scrape series: of this component's job only
                assert f'job="{group}"' in expr, alert


def test_the_stall_rule_can_fire_before_the_first_batch(tmp_path: Path) -> None:
    """The last batch's timestamp only exists once a batch is committed: the rule needs an arm
    of its ``or`` that selects only what a sink serves before its first batch."""
    options = SinkOptions.parse({"path": str(tmp_path / "out")})
    open_output(options.path, options.rejects_path, QUERY)
    kafka = FakeKafka()
    kafka.marks = {("t", 0): (0, 100)}
    sink = SinkMetrics(str(tmp_path / "out"), "-", ["t"], str(tmp_path / "ckpt"), watermarks=kafka)
    before = families(generate_latest(sink.registry).decode())
    assert "pidfence_sink_last_batch_timestamp_seconds" not in before
    assert "pidfence_sink_batches" in before
    ors: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.BinaryExpr) and str(node.op) == "or":
            ors.append(node)

    promql_parser.walk(promql_parser.parse(rule_exprs()["PidfenceSinkStalled"]), pre_visit=visit)
    arms = [selected_by(side) for node in ors for side in (node.lhs, node.rhs)]
    assert any(arm and {SUFFIXES.sub("", n) for n in arm} <= before for arm in arms), arms


def test_every_dashboard_query_parses_and_both_components_are_on_it() -> None:
    assert DASHBOARDS, "no dashboard under docs/dashboards"
    names = set().union(*(selected_metrics(e) for e in dashboard_exprs().values()))
    assert any(n.startswith("pidfence_sink_") for n in names)
    assert any(n.startswith("pidfence_") and not n.startswith("pidfence_sink_") for n in names)
    for path in DASHBOARDS:
        ids = [p["id"] for p in json.loads(path.read_text())["panels"]]
        assert len(ids) == len(set(ids)), path


def committed_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CollectorRegistry:
    """The registry of a sink with one committed batch (the last batch's gauges exist from
    then on)."""
    options = SinkOptions.parse({"path": str(tmp_path / "out")})
    open_output(options.path, options.rejects_path, QUERY)
    writer = PidfenceStreamWriter(options)
    writer.commit([write_task(monkeypatch, writer, 0, two_partitions(1, 40)[0])], 0)
    kafka = FakeKafka()
    kafka.marks = {("t", 0): (0, 100), ("t", 1): (0, 100)}
    sink = SinkMetrics(str(tmp_path / "out"), "-", ["t"], str(tmp_path / "ckpt"), watermarks=kafka)
    return sink.registry


def test_every_metric_queried_exists_in_a_scrape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scraped = families(generate_latest(committed_sink(tmp_path, monkeypatch)).decode())
    scraped |= families(generate_latest(ServerMetrics().registry).decode())
    assert missing_from(scraped) == {}


def test_a_metric_that_does_not_exist_is_found_missing() -> None:
    # The check has teeth: a renamed metric is reported where it is used.
    assert missing_from({"pidfence_sink_lag_records"})["PidfenceGapOpened"] == {
        "pidfence_sink_gaps_opened_total"
    }


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_checks_the_rules_and_their_unit_tests_fire() -> None:
    # pidfence.test.yml: each alert fires on the series it is for, and not on its look-alikes
    # (an idle sink with an old batch, a sink started minutes ago, duplicates, one ZooKeeper
    # error, a burst of rate limits).
    for args in (["check", "rules", *map(str, RULES)], ["test", "rules", "pidfence.test.yml"]):
        done = subprocess.run(
            [str(PROMTOOL), *args], capture_output=True, text=True, check=False, cwd=DOCS / "alerts"
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_the_scrape_config_in_the_docs_loads_the_rules(tmp_path: Path) -> None:
    text = (DOCS / "metrics.md").read_text()
    config = re.search(r"```yaml\n(# prometheus\.yml.*?)```", text, re.DOTALL)
    assert config is not None, "docs/metrics.md lost its prometheus.yml example"
    (tmp_path / "prometheus.yml").write_text(config.group(1))
    for rules in RULES:
        shutil.copy(rules, tmp_path)
    done = subprocess.run(
        [str(PROMTOOL), "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in done.stdout, done.stdout
