"""The demo's services: ZooKeeper, Kafka, topics, two lease servers, and (``net``) the fault proxy.

Under the ``net`` fault every link runs through a toxiproxy proxy: Kafka is a
:class:`~pidfence.testing.ProxiedKafka` (the producers' and the sink's listeners advertise their
proxies), the lease servers reach ZooKeeper through one, and the producers reach each lease
server through one. With ``--bootstrap`` the Kafka links cannot be proxied (the brokers advertise
their own addresses); the report says so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pidfence.demo.config import DemoConfig, Fault, SinkStore
from pidfence.demo.record import DemoPaths, Endpoints
from pidfence.demo.topic import create_raw_topic
from pidfence.services.kafka import create_topic, delete_topics
from pidfence.services.lease_server import LeaseServerProcess, make_lease_pki, spawn_lease_server
from pidfence.services.ports import free_port
from pidfence.services.seaweedfs import SeaweedFS
from pidfence.services.zookeeper import drop_chroot, new_chroot
from pidfence.testing.network import LinkFaults, ProxiedKafka, link_proxies
from pidfence.testing.plan import Link
from pidfence.testing.toxiproxy import Proxy, Toxiproxy, ToxiproxyServer

Cleanups = list[Callable[[], None]]
#: The lease lifetime without short-lease faults.
DAY_MS = 24 * 3600 * 1000


@dataclass
class Started:
    """What :func:`start_services` started: where it is, and the proxies of ``net``."""

    endpoints: Endpoints
    links: LinkFaults | None = None
    lease_servers: list[LeaseServerProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def s3_store(config: DemoConfig, paths: DemoPaths, cleanups: Cleanups) -> SeaweedFS | None:
    """``--store s3``: the run's SeaweedFS store (data in ``out/run/s3``), not started yet,
    stopped by pid with the demo. Its AWS environment is set in this process until the demo ends:
    pyarrow, delta-rs, boto3 and Spark's S3A read it there, Spark's Python workers inherit it."""
    if config.store is not SinkStore.S3:
        return None
    store = SeaweedFS(run_dir=paths.run / "s3")
    cleanups.append(store.stop)
    set_environment(store.environment(), cleanups)
    return store


def set_environment(values: Mapping[str, str], cleanups: Cleanups) -> None:
    """Set ``values`` in this process's environment; ``cleanups`` put them back as they were (the
    demo may run inside a caller's process, e.g. the test suite)."""
    before = {name: os.environ.get(name) for name in values}

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    cleanups.append(restore)
    os.environ.update(values)


def start_services(
    config: DemoConfig, paths: DemoPaths, cleanups: Cleanups, store: SeaweedFS | None = None
) -> Started:
    """Start (or reuse) every service, ``store`` (from :func:`s3_store`) too; each stop is added to
    ``cleanups``."""
    from pidfence.services import KafkaCluster, ZooKeeperEnsemble

    pids: dict[str, int] = {}
    notes: list[str] = []
    output, checkpoint = str(paths.sink_output.resolve()), str(paths.sink_checkpoint.resolve())
    if store is not None:
        store.start()
        pids.update({f"seaweedfs-{i}": p for i, p in enumerate(store.pids())})
        bucket = store.make_bucket("demo")
        output, checkpoint = f"{bucket}/output", f"{bucket}/checkpoint"
    toxiproxy: Toxiproxy | None = None
    proxies: dict[Link, list[Proxy]] = {}
    if Fault.NET in config.faults:
        server = ToxiproxyServer(paths.logs).start()
        cleanups.append(server.stop)
        toxiproxy = server.client
        if server.pid is not None:
            pids["toxiproxy"] = server.pid
    if config.zk_hosts:
        zk_hosts = config.zk_hosts
        if "/" not in zk_hosts:  # the user's ZooKeeper: a namespace of this run's own
            zk_hosts = new_chroot(zk_hosts, "/pidfence-demo")
            cleanups.append(partial(drop_chroot, zk_hosts))
    else:
        zk = ZooKeeperEnsemble(1, run_dir=paths.run / "zookeeper")
        cleanups.append(zk.stop)
        zk.start()
        zk_hosts = zk.hosts
        pids.update({f"zookeeper-{i}": p for i, p in enumerate(zk.pids())})
    raw, upstream = "raw", "upstream"
    if config.bootstrap:
        bootstrap = producer_bootstrap = sink_bootstrap = config.bootstrap
        suffix = uuid.uuid4().hex[:8]
        raw, upstream = f"pidfence-demo-raw-{suffix}", f"pidfence-demo-upstream-{suffix}"
        if toxiproxy is not None:
            notes.append(
                "Kafka links not proxied: --bootstrap names brokers this demo cannot "
                "make advertise a proxy"
            )
    else:
        kafka: KafkaCluster
        if toxiproxy is not None:
            kafka = ProxiedKafka(toxiproxy, run_dir=paths.run / "kafka")
        else:
            kafka = KafkaCluster(1, run_dir=paths.run / "kafka")
        cleanups.append(kafka.stop)
        kafka.start()
        bootstrap = producer_bootstrap = sink_bootstrap = kafka.bootstrap
        if isinstance(kafka, ProxiedKafka):
            producer_bootstrap = kafka.bootstrap_for(Link.PRODUCER_KAFKA)
            sink_bootstrap = kafka.bootstrap_for(Link.SINK_KAFKA)
            proxies |= {link: [proxy] for link, proxy in kafka.proxies.items()}
        pids.update({f"kafka-{i}": p for i, p in enumerate(kafka.pids())})
    create_raw_topic(bootstrap, raw, config.partitions)
    create_topic(bootstrap, upstream, config.partitions)
    if config.bootstrap:  # the user's cluster: no demo topic left behind (--keep-running keeps)
        cleanups.append(partial(delete_topics, bootstrap, [raw, upstream]))
    lease_zk = zk_hosts
    if toxiproxy is not None:
        hosts, slash, chroot = zk_hosts.partition("/")
        proxy = link_proxies(toxiproxy, {Link.LEASE_ZOOKEEPER: hosts.split(",")[0]})
        lease_zk = f"{proxy[Link.LEASE_ZOOKEEPER].address}{slash}{chroot}"
        proxies[Link.LEASE_ZOOKEEPER] = list(proxy.values())
    servers, metrics = _start_lease_servers(config, paths, lease_zk, cleanups, pids)
    addresses = [s.address for s in servers]
    if toxiproxy is not None:
        fronts = [
            link_proxies(toxiproxy, {Link.PRODUCER_LEASE: a})[Link.PRODUCER_LEASE]
            for a in addresses
        ]
        proxies[Link.PRODUCER_LEASE] = fronts
        addresses = [p.address for p in fronts]
    endpoints = Endpoints(
        bootstrap=bootstrap,
        zk_hosts=zk_hosts,
        raw_topic=raw,
        upstream_topic=upstream,
        lease_servers=",".join(addresses),
        producer_bootstrap=producer_bootstrap,
        sink_bootstrap=sink_bootstrap,
        output=output,
        checkpoint=checkpoint,
        pids=pids,
        metrics=metrics,
        store=store.environment() if store is not None else {},
    )
    links = LinkFaults(proxies) if toxiproxy is not None else None
    return Started(endpoints, links, servers, notes)


def _start_lease_servers(
    config: DemoConfig, paths: DemoPaths, zk_hosts: str, cleanups: Cleanups, pids: dict[str, int]
) -> tuple[list[LeaseServerProcess], dict[str, str]]:
    """Two lease servers with auth tokens and TLS, from certificates made now, each serving
    Prometheus metrics; returns them and their metrics URLs by name.

    Every pidfence process the demo starts inherits the client side through the environment
    (``PIDFENCE_LEASE_TOKEN_FILE``, ``PIDFENCE_LEASE_TLS_CA``; :func:`set_environment`): a token
    never shows in ``ps``.
    """
    from pidfence.pid_allocator.security import TLS_CA_ENV, TOKEN_FILE_ENV

    pki = make_lease_pki(paths.pki)  # out/run/pki: never the README quickstart's out/pki
    client = {TOKEN_FILE_ENV: str(pki.token_files["producer"]), TLS_CA_ENV: str(pki.ca)}
    set_environment(client, cleanups)
    lifetime_ms = round(config.lease_lifetime_s * 1000) if config.short_leases else DAY_MS
    ports = [free_port(), free_port()]
    servers = two_lease_servers(
        zk_hosts, paths.logs, cleanups, lifetime_ms, ports, **pki.server_options()
    )
    pids.update({f"lease-{i}": s.pid for i, s in enumerate(servers) if s.pid is not None})
    return servers, {f"lease-{i}": f"http://127.0.0.1:{p}/metrics" for i, p in enumerate(ports)}


def two_lease_servers(
    zk_hosts: str,
    logs: Path,
    cleanups: Cleanups,
    lifetime_ms: int,
    metrics_ports: Sequence[int | None] = (None, None),
    **options: Any,
) -> list[LeaseServerProcess]:
    """Lease servers ``lease-0`` and ``lease-1`` (serving metrics on ``metrics_ports``), started
    side by side, each stopped by ``cleanups`` even when the other fails to start; returned once
    both listen."""
    servers = []
    for i, metrics_port in enumerate(metrics_ports):
        name = f"lease-{i}"
        server = spawn_lease_server(
            zk_hosts,
            logs,
            name=name,
            wait=False,
            lifetime_ms=lifetime_ms,
            metrics_port=metrics_port,
            **options,
        )
        cleanups.append(server.stop)
        servers.append(server)
    for server in servers:
        server.wait_listening()
    return servers
