"""Network links through the fault proxy: a Kafka whose clients reconnect through it, and the
toxics each network fault step puts on a link.

:class:`ProxiedKafka` is a one-node Kafka with a listener of its own per proxied link
(``PRODUCER_KAFKA``, ``SINK_KAFKA``), each advertising the port of a toxiproxy proxy in front of
it: a client that bootstraps through a link's proxy learns the proxy's address from the
metadata, so every reconnect goes through the proxy too, and a fault on the producers' link leaves
the sink's alone. The ``PLAINTEXT`` listener stays direct (topic admin, reading for the checker).

:func:`toxics_for` turns one :class:`~pidfence.testing.plan.FaultStep` into toxiproxy toxics;
:class:`LinkFaults` applies and removes them on the proxies of a run.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidfence.services.kafka import KafkaCluster
from pidfence.services.ports import free_port
from pidfence.testing.plan import FaultKind, FaultStep, Link
from pidfence.testing.toxiproxy import Proxy, Toxiproxy

#: The Kafka links a :class:`ProxiedKafka` can front.
KAFKA_LINKS = (Link.PRODUCER_KAFKA, Link.SINK_KAFKA)


class ProxiedKafka(KafkaCluster):
    """A one-node Kafka whose ``links`` each have a listener behind a toxiproxy proxy.

    Args:
        toxiproxy: the proxy server's client.
        links: the Kafka links to front.
        run_dir: data and logs (a temporary folder by default).
        heap: JVM heap.
    """

    def __init__(
        self,
        toxiproxy: Toxiproxy,
        links: tuple[Link, ...] = KAFKA_LINKS,
        run_dir: Path | None = None,
        heap: str = "512m",
    ) -> None:
        super().__init__(1, run_dir=run_dir, heap=heap)
        tag = uuid.uuid4().hex[:8]
        self.direct_ports = {link: free_port() for link in links}
        self.proxies: dict[Link, Proxy] = {
            link: toxiproxy.create_proxy(f"kafka-{link.value}-{tag}", f"127.0.0.1:{port}")
            for link, port in self.direct_ports.items()
        }

    def bootstrap_for(self, link: Link) -> str:
        """``bootstrap.servers`` for clients on ``link`` (through its proxy)."""
        return self.proxies[link].address

    def _configure(self, i: int) -> Path:
        cfg = super()._configure(i)
        props = dict(line.split("=", 1) for line in cfg.read_text().splitlines() if "=" in line)
        names = {link: link.name for link in self.proxies}
        props["listeners"] += "".join(
            f",{names[link]}://127.0.0.1:{port}" for link, port in self.direct_ports.items()
        )
        props["advertised.listeners"] += "".join(
            f",{names[link]}://{proxy.address}" for link, proxy in self.proxies.items()
        )
        props["listener.security.protocol.map"] += "".join(
            f",{name}:PLAINTEXT" for name in names.values()
        )
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return cfg


@dataclass(frozen=True)
class Toxic:
    """One toxic to add: its type, direction and attributes."""

    kind: str
    stream: str
    attributes: Mapping[str, int]


def toxics_for(fault: FaultStep) -> list[Toxic]:
    """The toxics that make ``fault`` happen on its link.

    Raises:
        ValueError: ``fault`` is not a network step.
    """
    kind = fault.kind
    if kind is FaultKind.LATENCY:
        latency = {
            "latency": int(fault.param("latency_ms", 200)),
            "jitter": int(fault.param("jitter_ms", 0)),
        }
        return [Toxic("latency", "upstream", latency), Toxic("latency", "downstream", latency)]
    if kind is FaultKind.BLACKHOLE:
        hold = {"timeout": int(fault.param("timeout_ms", 0))}
        return [Toxic("timeout", "upstream", hold), Toxic("timeout", "downstream", hold)]
    if kind is FaultKind.ONE_WAY_LOSS:
        # Requests go through; every reply is dropped until the toxic is removed.
        return [Toxic("timeout", "downstream", {"timeout": 0})]
    if kind is FaultKind.RESET:
        return [Toxic("reset_peer", "upstream", {"timeout": int(fault.param("timeout_ms", 0))})]
    if kind is FaultKind.BANDWIDTH:
        return [Toxic("bandwidth", "upstream", {"rate": int(fault.param("rate_kbps", 64))})]
    if kind is FaultKind.SLICE:
        size = int(fault.param("average_size", 32))
        slices = {
            "average_size": size,
            "size_variation": size // 2,
            "delay": int(fault.param("delay_us", 0)),
        }
        return [Toxic("slicer", "downstream", slices)]
    raise ValueError(f"{kind} is not a network fault")


class LinkFaults:
    """Puts network fault steps on the proxies of a run, and takes them off.

    Args:
        proxies: the proxy (or proxies: one per server) of each link the run has; a step on
            another link is skipped.
    """

    def __init__(self, proxies: Mapping[Link, Proxy | Sequence[Proxy]]) -> None:
        self.proxies: dict[Link, list[Proxy]] = {
            link: [found] if isinstance(found, Proxy) else list(found)
            for link, found in proxies.items()
        }
        self._active: dict[int, list[tuple[Proxy, str]]] = {}

    def covers(self, fault: FaultStep) -> bool:
        """True when the run has a proxy on the step's link."""
        return bool(self.proxies.get(Link(fault.target)))

    def apply(self, index: int, fault: FaultStep) -> None:
        """Add the step's toxics (named after its index in the plan) on every proxy of its link."""
        added: list[tuple[Proxy, str]] = self._active.setdefault(index, [])
        for proxy in self.proxies[Link(fault.target)]:
            for n, toxic in enumerate(toxics_for(fault)):
                name = f"step{index}-{n}-{toxic.kind}-{toxic.stream}"
                proxy.add_toxic(name, toxic.kind, toxic.stream, **toxic.attributes)
                added.append((proxy, name))

    def clear(self, index: int) -> None:
        """Remove the toxics of one step."""
        for proxy, name in self._active.pop(index, []):
            proxy.remove_toxic(name)

    def heal(self) -> None:
        """Remove every toxic this object added."""
        for index in list(self._active):
            self.clear(index)


def link_proxies(
    toxiproxy: Toxiproxy, upstreams: Mapping[Link, str], tag: str | None = None
) -> dict[Link, Proxy]:
    """A new proxy per link to its upstream ``host:port``; names carry ``tag`` (unique)."""
    suffix = tag or uuid.uuid4().hex[:8]
    return {
        link: toxiproxy.create_proxy(f"{link.value}-{suffix}", upstream)
        for link, upstream in upstreams.items()
    }


def describe_toxics(fault: FaultStep) -> str:
    """What the proxy does for ``fault``, for reports (``timeout downstream {timeout: 0}``)."""
    parts: list[Any] = [f"{t.kind} {t.stream} {dict(t.attributes)}" for t in toxics_for(fault)]
    return "; ".join(str(p) for p in parts)
