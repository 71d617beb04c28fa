"""Per-process state of a worker, beat or pump caller: settings, Redis client, queue, identity.

Built lazily and keyed by pid, because a prefork pool child must never reuse the parent's sockets
or threads: the first call after a fork builds a fresh runtime for the child.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field

import redis

from .connection import redis_client, resolve_redis_url
from .queue import TaskQueue
from .settings import Settings

_lock = threading.Lock()
_runtime: Runtime | None = None
_node: str | None = None


def set_node(name: str) -> None:
    """Remember the Celery node name (``celeryd_init`` in the main process, inherited by children)."""
    global _node
    _node = name


def node_name() -> str:
    return _node or f"celery@{socket.gethostname()}"


@dataclass
class Runtime:
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


def build_runtime(settings: Settings | None = None) -> Runtime:
    settings = settings or Settings.from_env()
    url = resolve_redis_url(settings)
    client = redis_client(url)
    queue = TaskQueue(client, settings.namespace, lease_ttl=settings.lease_ttl,
                      max_attempts=settings.max_attempts, max_stalls=settings.max_stalls)
    return Runtime(settings=settings, redis_url=url, client=client, queue=queue)


def runtime() -> Runtime:
    """This process's runtime (rebuilt after a fork)."""
    global _runtime
    current = _runtime
    if current is not None and current.pid == os.getpid():
        return current
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = build_runtime()
        return _runtime


def reset_runtime() -> None:
    """Forget the cached runtime (tests that change the environment)."""
    global _runtime
    _runtime = None
