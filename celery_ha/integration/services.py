"""What one worker, beat or pump process needs to talk to the durable layer: settings, the Redis
client, the task queue and this process's identity as a lease holder.

Built lazily once per process (:class:`celery_ha.base.per_process.PerProcess`), because a prefork
pool child must never reuse its parent's sockets: the first use after a fork builds a fresh one.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import redis

from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url
from celery_ha.state import TaskQueue

_node: list[str] = []


def set_node(name: str) -> None:
    """Remember the Celery node name (``celeryd_init`` in the main process, inherited by children)."""
    _node[:] = [name]


def node_name() -> str:
    return _node[0] if _node else f"celery@{socket.gethostname()}"


@dataclass
class Services:
    """Everything one process needs to talk to the durable layer."""

    settings: Settings
    redis_url: str
    client: redis.Redis
    queue: TaskQueue
    pid: int = field(default_factory=os.getpid)

    @property
    def node(self) -> str:
        return node_name()

    @property
    def worker_name(self) -> str:
        """The lease holder string: ``node:pid``, so failover can tell pool children apart."""
        return f"{self.node}:{self.pid}"


def socket_timeout(settings: Settings) -> float:
    """Seconds one Redis call of a worker may take: a third of the lease TTL (1-10 s). A Redis that
    is paused or cut off by a partition (no RST) would otherwise hold a call, and with it the lease
    keeper or a task, until TCP gives up hours later; with it the call fails as an infrastructure
    error, the task is handed back, and the worker carries on when Redis answers again."""
    return min(10.0, max(1.0, settings.lease_ttl / 3))


def build_services(settings: Settings | None = None) -> Services:
    settings = settings or Settings.from_env()
    url = resolve_redis_url(settings)
    timeout = socket_timeout(settings)
    client = redis_client(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    return Services(settings=settings, redis_url=url, client=client,
                    queue=TaskQueue.for_settings(client, settings))


_services: PerProcess[Services] = PerProcess(build_services)


def services() -> Services:
    """This process's services (rebuilt after a fork)."""
    return _services.get()


def reset_services() -> None:
    """Forget the cached services (tests that change the environment)."""
    _services.reset()
