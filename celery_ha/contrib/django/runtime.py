"""What a Django process holds once: its configuration, one Redis client (one pool) and its queues.

Requests share the client instead of opening one, and its connections, per request. Pushes after a
commit run on a small pool of pusher threads (each keeps one connection), so a request waits for
its push at most ``PUSH_TIMEOUT`` in all — whatever the push meets: a frozen Redis, a reconnect, a
slow name lookup — and what it did not see pushed stays in the outbox for the relay. After a push
that failed or ran late, pushes are skipped for a moment (the breaker), so the next requests, and
the next enqueue of the same commit, do not each wait out the same outage. The client's own
timeouts are the push timeout too, and it never retries by itself, so a late push also ends soon.
The runtime is per process (fork-safe): a server that forks workers after loading the app gives
each worker its own sockets and threads.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_ha.base.per_process import PerProcess
from celery_ha.contrib.django.conf import DjangoConfig, load
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url
from celery_ha.state import TaskQueue

#: The client name every connection of the Django app announces (CLIENT LIST shows who holds what).
CLIENT_NAME = "celery-ha-django"
#: Pusher threads per process: pushes of concurrent commits in flight at once.
PUSHERS = 4


class Breaker:
    """Skip pushes for ``cooldown`` seconds after one failed or ran late (their rows wait for the
    relay), then let the next one try."""

    def __init__(self, cooldown: float) -> None:
        self.cooldown = cooldown
        self._open_until = 0.0

    def allows(self) -> bool:
        return time.monotonic() >= self._open_until

    def trip(self) -> None:
        self._open_until = time.monotonic() + self.cooldown


@dataclass
class DjangoRuntime:
    """The per-process state: built on first use, never at import or app loading (no connection then)."""

    config: DjangoConfig
    client: redis.Redis
    breaker: Breaker
    _queues: dict[str, TaskQueue] = field(default_factory=dict)
    _pushers: ThreadPoolExecutor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def queue(self, namespace: str | None = None) -> TaskQueue:
        """The queue of ``namespace`` (default: the configured one), with the configured limits."""
        name = namespace or self.config.settings.namespace
        found = self._queues.get(name)
        if found is None:
            found = self._queues[name] = TaskQueue.for_settings(self.client, self.config.settings, name)
        return found

    def pushers(self) -> ThreadPoolExecutor:
        """The pusher threads (started on the first push)."""
        with self._lock:
            if self._pushers is None:
                self._pushers = ThreadPoolExecutor(PUSHERS, thread_name_prefix="celery-ha-push")
            return self._pushers

    def close(self) -> None:
        if self._pushers is not None:
            self._pushers.shutdown(wait=False)
        self.client.close()


def current_config() -> DjangoConfig:
    """The project's configuration, validated (ImproperlyConfigured if it is bad)."""
    from django.conf import settings

    return load(settings)


def _build() -> DjangoRuntime:
    config = current_config()
    settings = config.settings
    # The embedded one only when asked for (``load`` refused a missing URL otherwise).
    url = settings.redis_url or resolve_redis_url(settings, start=config.embedded)
    timeout = config.push_timeout
    client = redis_client(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                          retry=Retry(NoBackoff(), 0), client_name=CLIENT_NAME)
    return DjangoRuntime(config=config, client=client, breaker=Breaker(max(1.0, 2 * timeout)))


_RUNTIME: PerProcess[DjangoRuntime] = PerProcess(_build)


def runtime() -> DjangoRuntime:
    """This process's runtime (built on first use)."""
    return _RUNTIME.get()


def reset() -> None:
    """Forget the runtime (settings changed, e.g. ``override_settings`` in a project's tests)."""
    built = _RUNTIME.peek()
    _RUNTIME.reset()
    if built is not None:
        built.close()
