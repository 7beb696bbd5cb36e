"""``pidfence.testing``: one harness for faults, the way kazoo's ``testing`` package serves users.

* :class:`FaultPlan` / :class:`FaultStep`: a seeded, replayable plan of faults (process kills
  and pauses, sink crash points, network toxics); :meth:`FaultPlan.network` makes the
  seeded network nemesis; :func:`sim_knobs` maps a plan onto the simulation's knobs.
* :class:`FaultScript` and :func:`drive`: polled fault state machines and their loop;
  :class:`NetworkNemesis` runs a plan's toxics; :class:`Supervisor` restarts what exits 75.
* :class:`ManualClock`: a clock that moves only when the test moves it (every ``clock=``).
* :class:`ToxiproxyServer`, :class:`Toxiproxy`, :class:`Proxy`: the TCP fault proxy;
  :class:`ProxiedKafka` fronts Kafka's links with it; :class:`LinkFaults` applies toxics.
* :class:`SinkFaults` and ``python -m pidfence.testing.run`` (:func:`run_argv`): the sink's crash
  points and a task failure, installed in the sink's driver and every Python process Spark
  starts; deliberately broken builds (``--mutation``) for proving a test has teeth.
"""

from pidfence.testing.clock import ManualClock
from pidfence.testing.launch import run_argv
from pidfence.testing.mutations import MUTATIONS, UnknownMutation, install_mutation
from pidfence.testing.nemesis import NetworkNemesis
from pidfence.testing.network import KAFKA_LINKS, LinkFaults, ProxiedKafka, link_proxies
from pidfence.testing.plan import (
    NETWORK_KINDS,
    BadFaultPlan,
    FaultKind,
    FaultPlan,
    FaultStep,
    Link,
    step,
)
from pidfence.testing.script import FaultScript, drive
from pidfence.testing.sim_plan import sim_knobs, unmapped
from pidfence.testing.sink_faults import BadSinkFault, SinkFaults
from pidfence.testing.supervise import Supervisor
from pidfence.testing.toxiproxy import (
    Proxy,
    Toxiproxy,
    ToxiproxyError,
    ToxiproxyMissing,
    ToxiproxyServer,
    missing_reason,
)

__all__ = [
    # the plan
    "FaultPlan",
    "FaultStep",
    "FaultKind",
    "Link",
    "NETWORK_KINDS",
    "step",
    "BadFaultPlan",
    "sim_knobs",
    "unmapped",
    # running faults
    "FaultScript",
    "drive",
    "NetworkNemesis",
    "Supervisor",
    "ManualClock",
    # the network
    "ToxiproxyServer",
    "Toxiproxy",
    "Proxy",
    "ToxiproxyError",
    "ToxiproxyMissing",
    "missing_reason",
    "ProxiedKafka",
    "KAFKA_LINKS",
    "LinkFaults",
    "link_proxies",
    # hooks in processes under test
    "SinkFaults",
    "BadSinkFault",
    "run_argv",
    "MUTATIONS",
    "UnknownMutation",
    "install_mutation",
]
