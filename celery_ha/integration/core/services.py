"""What one worker, beat or pump process needs to talk to the durable layer: settings, the Redis
client, the task queue and this process's identity as a lease holder.

Built lazily once per process (:class:`celery_ha.base.per_process.PerProcess`), because a prefork
pool child must never reuse its parent's sockets: the first use after a fork builds a fresh one.

One process may serve several namespaces (``CELERY_HA_NAMESPACES=shop,news``): each gets its own
:class:`Services` (its settings with that namespace, its task queue), all sharing the process's one
Redis client. :func:`services` with no argument returns the namespace this thread is serving (set by
:func:`serving` around a task's run or a maintenance job), else the process's own namespace (the
first served); :func:`served` returns every one. A message tells its namespace by the broker queue
it came from (``<namespace>.crawl``, ``<namespace>.maintenance``): :func:`namespace_of_queue`.

A pattern among them (``CELERY_HA_NAMESPACES=crawl-*``) serves every namespace of the registry
(``state/namespaces.py``) that matches it: :func:`discovered` reads the registry at most every
``CELERY_HA_DISCOVERY_INTERVAL`` seconds, in each process (the worker's main process, to consume the
new namespace's queues: ``integration/worker/discovery.py``; a pool child, to renew and register
there). A message of a matching namespace is served even before its process has looked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.namespace_lists import MAX_SERVED_NAMESPACES, matches_namespace_pattern
from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url
from celery_ha.state import TaskQueue
from celery_ha.state.namespaces import servable_matches

log = logging.getLogger(__name__)

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
        raise ConfigurationError("celery-ha is already attached with other settings in this process ("
                                 + settings_difference(_configured[0], settings)
                                 + "); one celery-ha configuration per process")
    if not _configured:
        _configured.append(settings)
        _services.reset()


def settings_difference(before: Settings, after: Settings) -> str:
    """The fields two settings differ in, with both values (URLs masked; a secret by name only):
    ``namespace 'shop' -> 'news', lease_ttl 30.0 -> 10.0``."""
    shown = []
    for f in fields(Settings):
        old, new = getattr(before, f.name), getattr(after, f.name)
        if old == new:
            continue
        if not f.repr:  # a password: named, never shown
            shown.append(f"{f.name} (secret)")
        else:
            show = [repr(mask_url(v)) if isinstance(v, str) else repr(v) for v in (old, new)]
            masked_alike = show[0] == show[1]  # URLs that differ in their credentials only
            shown.append(f"{f.name} {show[0]} (other credentials)" if masked_alike
                         else f"{f.name} {show[0]} -> {show[1]}")
    return ", ".join(shown)


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
#: The services of the namespaces served beside the process's own, by namespace (built on first use,
#: from the own services' settings and client), with the lock that builds them: both per process, so
#: a pool child never inherits a lock some thread of its parent held at the fork.
_others: PerProcess[tuple[dict[str, Services], threading.Lock]] = PerProcess(lambda: ({}, threading.Lock()))
_serving = threading.local()


def services(namespace: str | None = None) -> Services:
    """The services of ``namespace`` (one this process serves), else of the namespace this thread is
    serving (:func:`serving`), else of the process's own namespace; rebuilt after a fork."""
    own = _services.get()
    if namespace is None:
        namespace = getattr(_serving, "namespace", None)
    if namespace is None or namespace == own.settings.namespace:
        return own
    others, lock = _others.get()
    rt = others.get(namespace)
    if rt is None:
        if not own.settings.serves(namespace):
            listed = ", ".join(own.settings.namespaces or own.settings.served_namespaces)
            raise ConfigurationError(f"namespace {namespace!r} is not served by this process "
                                     f"(CELERY_HA_NAMESPACES: {listed})")
        with lock:
            rt = others.get(namespace)
            if rt is None:
                settings = replace(own.settings, namespace=namespace)
                rt = Services(settings=settings, redis_url=own.redis_url, client=own.client,
                              queue=TaskQueue.for_settings(own.client, settings))
                others[namespace] = rt
    return rt


class _Found:
    """The namespaces this process's patterns matched so far (sticky: a worker keeps serving what it
    started serving), when it last looked, and the lock of a look."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.at = float("-inf")
        self.warned = False
        self.refused: set[str] = set()  # matches of another shard count (warned once each)
        self.lock = threading.Lock()


_found: PerProcess[_Found] = PerProcess(_Found)


def discovered(refresh: bool = False) -> list[str]:
    """The registered namespaces this process serves through its patterns (``CELERY_HA_NAMESPACES=
    crawl-*``) beside the ones it names, sorted; read from Redis at most every
    ``CELERY_HA_DISCOVERY_INTERVAL`` seconds (``refresh``: now). At most 64 served in all: a warning
    says how many matches are left out. Redis unreachable: the last answer."""
    own = _services.get()
    patterns = own.settings.namespace_patterns
    if not patterns:
        return []
    found = _found.get()
    if not refresh and time.monotonic() - found.at < own.settings.discovery_interval:
        return found.names
    with found.lock:
        found.at = time.monotonic()  # a failed look is tried again after the interval, not at each call
        try:
            new, refused = servable_matches(own.client, patterns, (*own.settings.served_namespaces,
                                                                    *found.names), own.settings.shards)
        except redis.RedisError as exc:
            log.warning("could not read the registry of namespaces: %s", exc)
            return found.names
        for ns in sorted(set(refused) - found.refused):
            log.warning("not serving namespace %r, which CELERY_HA_NAMESPACES matches: %s", ns, refused[ns])
        found.refused |= set(refused)
        room = MAX_SERVED_NAMESPACES - len(own.settings.served_namespaces) - len(found.names)
        if len(new) > room and not found.warned:
            found.warned = True
            log.warning("CELERY_HA_NAMESPACES: %d more namespace(s) match %s than one process serves "
                        "(%d); serving %s", len(new) - max(0, room), ",".join(patterns),
                        MAX_SERVED_NAMESPACES, ", ".join(new[:max(0, room)]) or "none of them")
        found.names = sorted([*found.names, *new[:max(0, room)]])
    return found.names


def own_services() -> Services:
    """The services of the process's own namespace, whatever this thread serves: for per-process
    machinery (lease keeper, watchdog) that then covers every served namespace itself."""
    return _services.get()


def served() -> list[Services]:
    """The services of every namespace this process serves, its own first, then those it names,
    then those its patterns matched (:func:`discovered`)."""
    return [services(ns) for ns in (*_services.get().settings.served_namespaces, *discovered())]


@contextlib.contextmanager
def serving(namespace: str | None) -> Iterator[Services]:
    """Within the block, :func:`services` (no argument) in this thread returns ``namespace``'s (None:
    the process's own); yields them."""
    before = getattr(_serving, "namespace", None)
    rt = services(namespace) if namespace is not None else _services.get()
    _serving.namespace = rt.settings.namespace
    try:
        yield rt
    finally:
        _serving.namespace = before


def namespace_of_queue(queue: str | None) -> str | None:
    """The served namespace whose broker queue ``queue`` is (``<namespace>.<logical queue>``; the
    longest match, since a namespace may hold '.'), or None: a message's ``delivery_info`` routing key
    says which namespace it belongs to."""
    if not queue:
        return None
    settings = _services.get().settings
    found = None
    for ns in settings.served_namespaces:
        if queue.startswith(ns + ".") and (found is None or len(ns) > len(found)):
            found = ns
    if settings.namespace_patterns:  # the longest prefix a pattern matches, if longer
        for at in range(len(queue) - 1, len(found or ""), -1):
            if queue[at] == "." and matches_namespace_pattern(queue[:at], settings.namespace_patterns):
                return queue[:at]
    return found


def namespace_of_request(request: object) -> str | None:
    """The served namespace of the Celery message being run (its routing key), or None (no delivery
    information: a task called directly, an eager run)."""
    info = getattr(request, "delivery_info", None) or {}
    return namespace_of_queue(info.get("routing_key") if isinstance(info, dict) else None)


def reset_services() -> None:
    """Forget the cached services and configuration (tests that change the environment)."""
    _services.reset()
    _others.reset()
    _found.reset()
    _configured.clear()
