"""Redis behind Sentinel: kombu-style ``sentinel://`` URLs and clients that follow the master.

A deployment names the sentinels, not the master: ``sentinel://[:password@]host:26379;
sentinel://host2:26379;…[/db]`` plus the master's name (``CELERY_HA_SENTINEL_MASTER``) and, for
sentinels that require AUTH, ``CELERY_HA_SENTINEL_PASSWORD``. The password in the URL is the Redis
(master) password, as kombu reads it, so one URL serves the state layer and the broker alike.

The client asks the sentinels for the master's address whenever it (re)connects, so after Sentinel
promotes a replica every process finds the new master by itself; each process logs one line per
master change it sees. Sockets time out, so a paused master is noticed instead of waited on forever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelConnectionPoolProxy

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.redisio.tls import tls_query_options

log = logging.getLogger(__name__)

SCHEME = "sentinel"
DEFAULT_PORT = 26379
#: Seconds a command may wait for the master: a paused master surfaces as an error, not a hang.
SOCKET_TIMEOUT = 10.0
SENTINEL_TIMEOUT = 2.0
#: TLS options a sentinel:// URL may carry (query parameters, as redis-py reads them on rediss://).


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith(SCHEME + "://")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``sentinel://`` URL: where the sentinels are and how to talk to the master."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    ssl_options: tuple[tuple[str, str], ...] = ()  # ssl_ca_certs, ssl_cert_reqs, ssl_certfile, ssl_keyfile

    def tls(self) -> dict[str, Any]:
        """redis-py connection options for TLS (empty without ``ssl=true``)."""
        return {"ssl": True, **dict(self.ssl_options)} if self.ssl else {}


#: The values ``ssl=`` may take (kombu's Sentinel URLs say ``ssl=true``).
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse kombu's form; every malformed part is a one-line ConfigurationError (password masked)."""
    where = mask_url(url)
    hosts: list[tuple[str, int]] = []
    dbs: set[int] = set()
    username = password = None
    ssl = False
    ssl_options: dict[str, str] = {}
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        try:
            parts = urlsplit(part)
            port = parts.port or DEFAULT_PORT
        except ValueError as exc:
            raise ConfigurationError(f"bad Sentinel URL {where!r}: {exc}") from None
        if parts.scheme.lower() != SCHEME or not parts.hostname:
            raise ConfigurationError(f"bad Sentinel URL {where!r}: every part must be sentinel://host:port")
        hosts.append((parts.hostname, port))
        if parts.password is not None and password is None:
            password = unquote(parts.password)
            username = unquote(parts.username) if parts.username else None
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigurationError(f"bad Sentinel URL {where!r}: the database must be a number")
            dbs.add(int(path))
        query = parse_qs(parts.query)
        flag = query.pop("ssl", ["false"])[0].lower()
        if flag not in _TRUE + _FALSE:
            raise ConfigurationError(f"bad Sentinel URL {where!r}: ssl={flag!r} is not true or false")
        ssl = ssl or flag in _TRUE
        ssl_options.update(tls_query_options(query, f"bad Sentinel URL {where!r}", also_known=("ssl",)))
    if ssl_options and not ssl:
        # TLS options without TLS would connect in clear, the password included: refused, as
        # rediss+cluster:// is required for a cluster's.
        raise ConfigurationError(f"bad Sentinel URL {where!r}: TLS options "
                                 f"({', '.join(sorted(ssl_options))}) need ssl=true")
    if not hosts:
        raise ConfigurationError(f"bad Sentinel URL {where!r}: no sentinel named")
    if len(dbs) > 1:
        raise ConfigurationError(f"bad Sentinel URL {where!r}: its parts name different databases")
    return SentinelURL(tuple(hosts), db=dbs.pop() if dbs else 0, username=username, password=password,
                       ssl=ssl, ssl_options=tuple(sorted(ssl_options.items())))


def broker_sentinel_url(url: str) -> str:
    """``url`` with the credentials and the database written on every part.

    kombu reads them from the part it happens to connect through, so
    ``sentinel://h1;sentinel://h2/1`` would put the broker in database 0 after a failover through
    ``h1`` while publishers that went through ``h2`` use database 1: messages sent on one side are
    never seen on the other.
    """
    target = parse_sentinel_url(url)
    cred = ""
    if target.password is not None:
        cred = f"{quote(target.username or '', safe='')}:{quote(target.password, safe='')}@"
    query = "?" + urlencode([("ssl", "true"), *target.ssl_options]) if target.ssl else ""
    return ";".join(f"{SCHEME}://{cred}{host}:{port}/{target.db}{query}" for host, port in target.sentinels)


class _FollowingProxy(SentinelConnectionPoolProxy):
    """Where master connections ask for the master's address: logs, once per change, when Sentinel
    names a new master."""

    def get_master_address(self) -> Any:
        address = super().get_master_address()
        previous = getattr(self, "_seen_master", None)
        if previous is not None and address != previous:
            log.warning("Redis Sentinel failover: master %r moved from %s:%s to %s:%s",
                        self.service_name, *previous, *address)
        self._seen_master = address
        return address


class _FollowingPool(SentinelConnectionPool):
    """redis-py's master pool with :class:`_FollowingProxy` as the connections' address source."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)
        self.proxy = _FollowingProxy(connection_pool=self, is_master=self.is_master,
                                     check_connection=self.check_connection, service_name=service_name,
                                     sentinel_manager=sentinel_manager)
        self.connection_kwargs["connection_pool"] = self.proxy

    def get_master_address(self) -> Any:
        return self.proxy.get_master_address()


def sentinel_manager(target: SentinelURL, sentinel_password: str | None = None, **options: Any) -> Sentinel:
    """A redis-py Sentinel for ``target`` (options go to the master connections)."""
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT,
                                       "socket_connect_timeout": SENTINEL_TIMEOUT, **target.tls()}
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    connection: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
                                  "db": target.db, **target.tls(), **options}
    if target.password is not None:
        connection["password"] = target.password
    if target.username:
        connection["username"] = target.username
    return Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **connection)


def sentinel_client(url: str, master: str | None, sentinel_password: str | None = None,
                    **options: Any) -> redis.Redis:
    """A client of the master Sentinel currently names for ``master``; follows every failover."""
    if not master:
        raise ConfigurationError(f"a Sentinel URL ({mask_url(url)!r}) needs the master's name in "
                                 "CELERY_HA_SENTINEL_MASTER")
    manager = sentinel_manager(parse_sentinel_url(url), sentinel_password, **options)
    return manager.master_for(master, redis_class=redis.Redis, connection_pool_class=_FollowingPool)


def sentinel_view(url: str, master: str, sentinel_password: str | None = None) -> dict[str, Any]:
    """What an operator needs after (or during) a failover: which master the sentinels name, its
    replicas with their lag, and how many sentinels answer. Never raises for an unreachable part."""
    target = parse_sentinel_url(url)
    manager = sentinel_manager(target, sentinel_password)
    reachable, state = 0, None
    for node in manager.sentinels:
        try:
            answer = node.sentinel_master(master)
        except (redis.RedisError, OSError):
            continue
        reachable += 1
        state = state or answer
    view: dict[str, Any] = {"mode": "sentinel", "master_name": master,
                            "sentinels": f"{reachable} of {len(manager.sentinels)} reachable",
                            "master": None, "replicas": []}
    if state is None:
        return view
    view["master"] = f"{state.get('ip')}:{state.get('port')}"
    view["master_flags"] = state.get("flags")
    view["quorum"] = state.get("quorum")
    try:
        info = manager.master_for(master, socket_timeout=SENTINEL_TIMEOUT).info("replication")
    except (redis.RedisError, OSError) as exc:
        view["master_error"] = type(exc).__name__
        return view
    for key, value in sorted(info.items()):
        if key.startswith("slave") and isinstance(value, dict):
            lag = value.get("lag")
            view["replicas"].append(f"{value.get('ip')}:{value.get('port')} {value.get('state')}, "
                                    f"lag {lag}s, offset {value.get('offset')}")
    view["master_repl_offset"] = info.get("master_repl_offset")
    return view
