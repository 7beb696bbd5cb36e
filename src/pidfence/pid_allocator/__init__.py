"""The PID lease server, its ZooKeeper block allocator, the lease ring and ``LeaseClient``."""

from pidfence.pid_allocator.client import Lease, LeaseClient
from pidfence.pid_allocator.clock import SteadyClock
from pidfence.pid_allocator.coordinator import Block, Coordinator, LineageRecord
from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.errors import (
    FrameLimitExceeded,
    InvalidServerList,
    LeaseCapacityExhausted,
    LeaseError,
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    LeaseTlsMismatch,
    MalformedRequest,
    NotOwner,
    RateLimited,
    StaleGeneration,
    Unauthenticated,
    UnknownOp,
    UnknownPid,
    UnsupportedVersion,
)
from pidfence.pid_allocator.memory import MemoryCoordinator
from pidfence.pid_allocator.ring import LeaseRing
from pidfence.pid_allocator.runtime import LeaseServerThread, RunningServer, start_server
from pidfence.pid_allocator.security import (
    SecretFileError,
    client_tls_context,
    lease_client_options,
    load_token_file,
    server_tls_context,
)
from pidfence.pid_allocator.server import LeaseServer
from pidfence.pid_allocator.service import Grant, LeaseService
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.settings_sources import load_settings
from pidfence.pid_allocator.zookeeper import ZkCoordinator

__all__ = [
    # client
    "Lease",
    "LeaseClient",
    "client_tls_context",
    "lease_client_options",
    "load_token_file",
    # errors
    "LeaseError",
    "MalformedRequest",
    "FrameLimitExceeded",
    "InvalidServerList",
    "UnsupportedVersion",
    "UnknownOp",
    "UnknownPid",
    "StaleGeneration",
    "NotOwner",
    "RateLimited",
    "Unauthenticated",
    "LeaseCapacityExhausted",
    "LeaseServiceUnavailable",
    "LeaseServerUnreachable",
    "LeaseTlsMismatch",
    "SecretFileError",
    # servers
    "LeaseServerSettings",
    "SettingsError",
    "load_settings",
    "LeaseServerThread",
    "RunningServer",
    "start_server",
    "LeaseServer",
    "LeaseService",
    "Grant",
    "server_tls_context",
    # state
    "Block",
    "Coordinator",
    "LineageRecord",
    "LeaseRing",
    "MemoryCoordinator",
    "SteadyClock",
    "ZkCoordinator",
]
