"""The PID lease server, its ZooKeeper block allocator, the lease ring and ``LeaseClient``."""

from pidfence.pid_allocator.client import Lease, LeaseClient
from pidfence.pid_allocator.coordinator import Block, Coordinator
from pidfence.pid_allocator.errors import (
    LeaseCapacityExhausted,
    LeaseError,
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    MalformedRequest,
    StaleGeneration,
    UnknownOp,
    UnknownPid,
    UnsupportedVersion,
)
from pidfence.pid_allocator.memory import MemoryCoordinator
from pidfence.pid_allocator.ring import LeaseRing
from pidfence.pid_allocator.runtime import (
    LeaseServerThread,
    SpawnedLeaseServer,
    spawn_lease_server,
)
from pidfence.pid_allocator.server import LeaseServer, ServerLimits
from pidfence.pid_allocator.service import LeaseService, ServiceConfig
from pidfence.pid_allocator.zk_blocks import ZkCoordinator

__all__ = [
    # client
    "Lease",
    "LeaseClient",
    # errors
    "LeaseError",
    "MalformedRequest",
    "UnsupportedVersion",
    "UnknownOp",
    "UnknownPid",
    "StaleGeneration",
    "LeaseCapacityExhausted",
    "LeaseServiceUnavailable",
    "LeaseServerUnreachable",
    # servers
    "LeaseServerThread",
    "SpawnedLeaseServer",
    "spawn_lease_server",
    "LeaseServer",
    "ServerLimits",
    "LeaseService",
    "ServiceConfig",
    # state
    "Block",
    "Coordinator",
    "LeaseRing",
    "MemoryCoordinator",
    "ZkCoordinator",
]
