"""Redis Cluster: ``redis+cluster://`` URLs and the redis-py ``RedisCluster`` client they build.

``redis+cluster://[user:password@]host:port[,host:port…][/0][?option=value…]`` names any number of
cluster nodes (seeds: the client asks one of them for the slot map and finds the rest itself);
``rediss+cluster://`` is the same over TLS, with ``ssl_ca_certs``, ``ssl_cert_reqs`` (``required``,
``optional``, ``none``), ``ssl_certfile`` and ``ssl_keyfile`` as query options. A cluster has only
database 0, so any other database is refused. The credentials are those of every node.

Every key of a namespace carries the ``{namespace}`` hash tag (or, with ``CELERY_HA_SHARDS``, one of
its shard tags), so each script's keys live in one slot; the scripts run through
:mod:`celery_ha.redisio.cluster_caller`, which keeps the no-second-run rule of the plain caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.redisio.tls import tls_query_options

SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379
#: Seconds a command may wait for a node: a paused node surfaces as an error, not a hang.
SOCKET_TIMEOUT = 10.0


def is_cluster_url(url: str) -> bool:
    return url.strip().lower().split("://", 1)[0] in SCHEMES


@dataclass(frozen=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL: the seed nodes and how to talk to every node."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    ssl_options: tuple[tuple[str, str], ...] = ()

    def connection_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.password is not None:
            options["password"] = self.password
        if self.username:
            options["username"] = self.username
        if self.ssl:
            options.update({"ssl": True, **dict(self.ssl_options)})
        return options


def _node(text: str, where: str) -> tuple[str, int]:
    """``host:port``, ``host`` or ``[v6]:port`` -> (host, port)."""
    host, port = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigurationError(f"bad Redis Cluster URL {where!r}: unclosed '[' in {text!r}")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ConfigurationError(f"bad Redis Cluster URL {where!r}: bad node {text!r}")
        port = rest[1:]
    elif ":" in text:
        host, port = text.rsplit(":", 1)
    if not host:
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: a node has no host")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: bad port {port!r}")
    return host, int(port) if port else DEFAULT_PORT


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse the URL; every malformed part is a one-line ConfigurationError (password masked)."""
    where = mask_url(url)
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: use redis+cluster:// or rediss+cluster://")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        user, sep, secret = cred.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
        if not sep:  # a lone token is a password, as redis:// reads it
            username, password = None, unquote(user)
    nodes = tuple(_node(n.strip(), where) for n in netloc.split(",") if n.strip())
    if not nodes:
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: no node named")
    path = parts.path.strip("/")
    if path not in ("", "0"):
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: a cluster has only database 0")
    options = tls_query_options(parse_qs(parts.query), f"bad Redis Cluster URL {where!r}")
    ssl = scheme == "rediss+cluster"
    if options and not ssl:
        raise ConfigurationError(f"bad Redis Cluster URL {where!r}: TLS options need rediss+cluster://")
    return ClusterURL(nodes, username=username, password=password, ssl=ssl,
                      ssl_options=tuple(sorted(options.items())))


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """A decoded-or-not (``options``) redis-py cluster client for ``url``.

    redis-py reads the slot map from a seed at once, so a cluster that no seed answers for raises
    ``redis.ConnectionError`` here (URL masked), the error a plain client raises at its first command.
    Options redis-py's cluster client does not pass to
    its nodes (``health_check_interval``) are dropped.
    """
    target = parse_cluster_url(url)
    kwargs: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT,
                              **target.connection_options(), **options}
    kwargs.pop("health_check_interval", None)
    kwargs.pop("db", None)
    try:
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in target.nodes], **kwargs)
    except RedisClusterException as exc:  # no seed answered, or none is a cluster node
        raise RedisConnectionError(f"Redis Cluster {mask_url(url)!r}: {mask_url(str(exc))}") from None


def is_cluster_client(client: object) -> bool:
    return isinstance(client, RedisCluster)


def cluster_view(client: RedisCluster) -> dict[str, Any]:
    """What an operator asks of a cluster: its state, and per node its role, keys, memory and version
    (each node read on its own, so one node's status never stands for the cluster). A node that does
    not answer is listed as such rather than failing the whole view."""
    nodes: list[dict[str, Any]] = []
    for node in sorted(client.get_nodes(), key=lambda n: (n.server_type != "primary", n.host, n.port)):
        entry: dict[str, Any] = {"node": f"{node.host}:{node.port}", "role": node.server_type or "unknown"}
        try:
            info = client.info(target_nodes=node)
            entry.update(keys=client.dbsize(target_nodes=node), used_memory=info.get("used_memory_human"),
                         version=info.get("redis_version"))
        except (RedisConnectionError, ResponseError) as exc:
            entry["error"] = mask_url(str(exc))
        nodes.append(entry)
    try:
        state = client.cluster_info().get("cluster_state", "unknown")
    except (RedisConnectionError, ResponseError):
        state = "unknown"
    return {"cluster_state": state, "masters": sum(1 for n in nodes if n["role"] == "primary"),
            "nodes": nodes}


def slot_owner(client: RedisCluster, slot: int) -> str:
    """``host:port`` of the master serving ``slot``, as the client's slot map says (read when the
    client was made, patched at each ``MOVED``)."""
    node = client.nodes_manager.get_node_from_slot(slot)
    return f"{node.host}:{node.port}"


def keys_in_slot(client: RedisCluster, slot: int) -> int:
    """How many keys ``slot`` holds on its master (``CLUSTER COUNTKEYSINSLOT``): every key of a hash
    tag that lands there, whichever namespace it belongs to."""
    return int(client.cluster_countkeysinslot(slot))
