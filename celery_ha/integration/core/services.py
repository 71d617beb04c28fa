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

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url
from celery_ha.state import TaskQueue

_node: list[str] = []
#: The settings ``init_app`` configured this process with (None: the environment's).
_configured: list[Settings] = []


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


def configure(settings: Settings) -> None:
    """Use ``settings`` in this process (and the pool children it forks) instead of the environment's:
    ``init_app(app, **settings)`` calls it. One configuration per process: services are per process,
    so a second, different one is refused instead of half-applied."""
    if _configured and _configured[0] != settings:
        raise ConfigurationError("celery-ha is already attached with other settings in this process "
                                 f"({_configured[0]!r}); one celery-ha configuration per process")
    if not _configured:
        _configured.append(settings)
        _services.reset()


def process_settings() -> Settings:
    """The settings of this process: those ``init_app`` configured, else the environment's (and Django's
    ``CELERY_HA`` dict)."""
    return _configured[0] if _configured else Settings.from_env()


def build_services(settings: Settings | None = None) -> Services:
    settings = settings or process_settings()
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
    """Forget the cached services and configuration (tests that change the environment)."""
    _services.reset()
    _configured.clear()
