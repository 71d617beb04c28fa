"""What celery-ha needs to know about the broker: how kombu connects to it (with every call bounded
in time), kombu's lists for a queue, and which task ids still wait in them.

kombu's Redis transport keeps one list per priority step (``queue``, ``queue\\x06\\x163`` …); the
step list and separator come from kombu itself (``broker_transport_options`` may override both).

Every connection to a Redis broker carries a socket timeout, a connect timeout and a health-check
interval (:func:`broker_timeout`): kombu's, celery-ha's own client (:func:`broker_client`), and so
Celery's event and heartbeat publishing, which use kombu's. Without them a broker that stops
answering without closing its sockets (a SIGSTOPped or partitioned server, a Sentinel master frozen
after its replica was promoted) holds a worker's event loop in a synchronous ``PUBLISH`` until TCP
gives up hours later, and the crawl waits for the old master to thaw.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.redis import PRIORITY_STEPS, Channel

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings, check_redis_url
from celery_ha.redisio.client import is_redis_url, redis_client
from celery_ha.redisio.cluster import is_cluster_url
from celery_ha.redisio.sentinel import broker_sentinel_url, is_sentinel_url, parse_sentinel_url

log = logging.getLogger(__name__)

_clients: PerProcess[dict[str, redis.Redis]] = PerProcess(dict)


@dataclass(frozen=True)
class KombuBroker:
    """What to hand kombu for a broker URL: the URL itself, transport options, and ``broker_use_ssl``."""

    url: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    use_ssl: dict[str, Any] | None = None


_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def broker_timeout(settings: Settings) -> float:
    """Seconds one call to a Redis broker may take: ``CELERY_HA_BROKER_TIMEOUT``, else a sixth of the
    lease TTL (1-5 s; 5 s with the default TTL). Broker commands are small (a push, an ack, an event's
    ``PUBLISH``), so a call that takes this long is talking to a server that stopped answering; it
    fails, kombu reconnects (under Sentinel: to the master the sentinels name now) and the message
    is sent again or left to the redispatch timeout. Shorter than the state client's
    (``services.socket_timeout``): a worker waits on its broker in its main event loop, where every
    second of waiting is a second no message is taken or acknowledged."""
    if settings.broker_timeout is not None:
        return settings.broker_timeout
    return min(5.0, max(1.0, settings.lease_ttl / 6))


def timeout_options(settings: Settings) -> dict[str, float]:
    """The redis-py connection options that bound every call to a Redis broker (kombu reads the same
    names from ``broker_transport_options``): the health check also sets how soon kombu drops a
    BRPOP connection whose reply is overdue (``brpop_timeout`` + the interval)."""
    timeout = broker_timeout(settings)
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, "health_check_interval": timeout}


def kombu_broker(url: str, settings: Settings) -> KombuBroker:
    """A Redis broker URL gets the timeouts of :func:`timeout_options` as transport options. A
    ``sentinel://`` URL also gets the database and credentials on every part (kombu reads them from
    the part it connects through), the master's name, the sentinels' AUTH and timeouts, and its TLS
    options for the sentinels (``sentinel_kwargs``) and the master (``broker_use_ssl``). A Redis
    Cluster URL is refused (kombu's Redis transport cannot talk to a cluster). Other URLs (RabbitMQ)
    pass as they are."""
    if is_cluster_url(url):
        raise ConfigurationError(f"CELERY_BROKER_URL={mask_url(url)!r}: Celery's Redis transport has no "
                                 "Redis Cluster support; give the broker a plain Redis, Sentinel or RabbitMQ "
                                 "(CELERY_BROKER_URL must be set when CELERY_HA_REDIS_URL is a cluster)")
    if not is_redis_url(url):
        scheme = url.strip().split(";", 1)[0].partition("://")[0].partition("+")[0]
        if not scheme or scheme.lower() not in {a.lower() for a in TRANSPORT_ALIASES}:
            raise ConfigurationError(f"CELERY_BROKER_URL={mask_url(url)!r}: kombu has no transport "
                                     f"{scheme!r} (redis://, rediss://, sentinel://, amqp://, …)")
        return KombuBroker(url)
    if not is_sentinel_url(url):
        check_redis_url(url, "CELERY_BROKER_URL")  # kombu would stop a worker with a traceback
    bounds = timeout_options(settings)
    if not is_sentinel_url(url):
        return KombuBroker(url, dict(bounds))
    target = parse_sentinel_url(url)
    options: dict[str, Any] = {"master_name": settings.sentinel_master, **bounds}
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": bounds["socket_timeout"],
                                       "socket_connect_timeout": bounds["socket_connect_timeout"],
                                       **target.tls()}
    if settings.sentinel_password:
        sentinel_kwargs["password"] = settings.sentinel_password
    if sentinel_kwargs:
        options["sentinel_kwargs"] = sentinel_kwargs
    use_ssl = None
    if target.ssl:
        use_ssl = dict(target.ssl_options)
        use_ssl["ssl_cert_reqs"] = _CERT_REQS[use_ssl.get("ssl_cert_reqs", "required")]
    return KombuBroker(broker_sentinel_url(url), options, use_ssl)


def broker_lists(queue: str, transport_options: dict[str, Any] | None = None) -> list[str]:
    """The Redis lists kombu uses for ``queue`` (one per priority step), as a client without kombu's
    ``global_keyprefix`` names them."""
    opts = transport_options or {}
    steps = opts.get("priority_steps", PRIORITY_STEPS)
    sep = opts.get("sep", Channel.sep)
    prefix = opts.get("global_keyprefix", "")
    return [f"{prefix}{queue}" if step == 0 else f"{prefix}{queue}{sep}{step}" for step in steps]


def broker_backlog(client: redis.Redis, queue: str, transport_options: dict[str, Any] | None = None
                   ) -> int:
    """How many messages wait in the broker for ``queue`` (sum over priority lists)."""
    pipe = client.pipeline(transaction=False)
    for name in broker_lists(queue, transport_options):
        pipe.llen(name)
    return sum(pipe.execute())


def broker_client(app: Any, settings: Settings | None = None) -> redis.Redis | None:
    """A client of the app's broker when it is a Redis one (one per URL and process), else None.
    Its calls are bounded like kombu's: the app's transport options when they carry the timeouts,
    else :func:`timeout_options` of ``settings`` (default: the environment's)."""
    url = str(app.conf.broker_url or "")
    if not is_redis_url(url):
        return None
    clients = _clients.get()
    client = clients.get(url)
    if client is None:
        transport = dict(getattr(app.conf, "broker_transport_options", None) or {})
        bounds = timeout_options(settings or Settings.from_env())
        bounds.update({k: transport[k] for k in bounds if transport.get(k)})
        client = clients[url] = redis_client(url, **bounds)
    return client


def message_task_ids(raw: str | bytes) -> list[str]:
    """The durable task ids one kombu message carries: its arguments (a batch carries several),
    else the id in its Celery task id; [] for a message that is not a durable task's."""
    try:
        message = json.loads(raw)
        first = str(message["headers"]["id"]).split(".", 1)[0]
    except (ValueError, KeyError, TypeError):
        return []
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        ids = [a for a in args if isinstance(a, str)]
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
        ids = []
    return ids or [first]


def waiting_ids(app: Any, queues: Iterable[str]) -> set[str] | None:
    """Durable task ids whose message still sits in the broker lists, or None when unknowable.

    The lists are bounded by the window, so reading them is cheap; it keeps a slow backlog (all
    workers busy with long tasks) from being re-sent every ``redispatch_after`` seconds.
    """
    client = broker_client(app)
    if client is None:
        return None
    opts = dict(app.conf.broker_transport_options or {})
    out: set[str] = set()
    try:
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            for name in broker_lists(queue, opts):
                pipe.lrange(name, 0, 100_000)
        for raws in pipe.execute():
            for raw in raws:
                out.update(message_task_ids(raw))
    except redis.RedisError as exc:
        log.warning("cannot inspect broker %s: %s", mask_url(str(app.conf.broker_url)), exc)
        return None
    return out
