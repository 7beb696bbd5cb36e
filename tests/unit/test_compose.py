"""``compose.yaml`` and the ``Dockerfile``: services, ports, dependencies (no Docker engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pidfence.cli import app

ROOT = Path(__file__).resolve().parents[2]
PIDFENCE_SERVICES = ("lease-server", "sink", "demo-producer")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def _depends(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on", {})
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in raw.items()}


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= {"zookeeper", "kafka", *PIDFENCE_SERVICES}
    assert services["zookeeper"]["image"] == "zookeeper:3.9"
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    for name in PIDFENCE_SERVICES:
        assert services[name]["build"] == ".", name
        assert services[name]["image"] == "pidfence:local", name


def test_kafka_runs_kraft(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "zookeeper" not in str(env).lower()
    assert "kafka" not in _depends(compose["services"]["kafka"])


def test_ports_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    published: dict[str, list[int]] = {}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            host_ip, host_port, container_port = str(port).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            assert host_port.isdigit() and container_port.isdigit()
            published.setdefault(name, []).append(int(host_port))
    assert published["zookeeper"] == [2181]
    assert published["kafka"] == [29092]
    assert 7070 in published["lease-server"]
    flat = [p for ports in published.values() for p in ports]
    assert len(flat) == len(set(flat))


def test_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep, condition in _depends(service).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s missing health"
    assert _depends(services["lease-server"])["zookeeper"] == "service_healthy"
    assert _depends(services["topic-init"])["kafka"] == "service_healthy"
    for name in ("sink", "demo-producer"):
        deps = _depends(services[name])
        assert deps["topic-init"] == "service_completed_successfully"
    assert _depends(services["demo-producer"])["lease-server"] == "service_healthy"
    for name in ("zookeeper", "kafka", "lease-server"):
        assert "test" in services[name]["healthcheck"]


def test_commands_name_real_pidfence_commands(compose: dict[str, Any]) -> None:
    import typer.main

    known = set(typer.main.get_group(app).commands)
    for name in PIDFENCE_SERVICES:
        command = compose["services"][name]["command"]
        assert command[0] in known, f"{name}: unknown command {command[0]}"
    assert compose["services"]["lease-server"]["command"][1:3] == ["--zk", "zookeeper:2181"]
    for name in ("sink", "demo-producer"):
        command = compose["services"][name]["command"]
        assert command[command.index("--bootstrap") + 1] == "kafka:9092"
        assert command[command.index("--topic") + 1] == "raw"


def test_dockerfile_has_python_and_a_jre() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    assert "jre" in text
    assert "pip install '.[sink]' && pidfence jars" in text  # jars fetched into the image
    assert "infra" not in text and "maven" not in text.lower().replace("maven central", "")
    assert 'ENTRYPOINT ["pidfence"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".cache", ".git"} <= set(ignored)


def test_lease_server_runs_with_auth_tls_and_signing(compose: dict[str, Any]) -> None:
    """DESIGN §5 amended: compose runs the lease server with tokens and TLS (certificates made
    at start by `pidfence keys pki`), clients take their token from the environment."""
    services = compose["services"]
    assert services["pki-init"]["command"][:2] == ["keys", "pki"]
    lease = services["lease-server"]
    for flag in ("--auth-tokens", "--tls-cert", "--tls-key", "--signing-key"):
        assert flag in lease["command"], flag
    assert lease["depends_on"]["pki-init"]["condition"] == "service_completed_successfully"
    assert "--tls-ca" in lease["healthcheck"]["test"]
    producer = services["demo-producer"]["environment"]
    assert producer["PIDFENCE_LEASE_TOKEN_FILE"] == "/pki/producer.token"  # noqa: S105 - a path
    assert "--token" not in services["demo-producer"]["command"]  # never on a command line
    assert "--lease-public-key" in services["sink"]["command"]
