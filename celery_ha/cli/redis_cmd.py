"""``celery-ha redis status|start|stop``: look after the embedded Redis."""

from __future__ import annotations

from typing import Any

import click
import redis
from redis.exceptions import NoPermissionError

from celery_ha.base.masking import mask_url
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.errors import one_line
from celery_ha.cli.render import console, echo_json, kv_table
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.cluster import cluster_view, is_cluster_client
from celery_ha.redisio.memory_policy import (
    compact_records_note,
    eviction_policy,
    eviction_warning,
    listpack_value,
)
from celery_ha.redisio.sentinel import is_sentinel_url, sentinel_view
from celery_ha.runtime.embedded import EmbeddedRedis


@click.group("redis")
def command() -> None:
    """Manage the embedded Redis (used when CELERY_HA_REDIS_URL is unset).

    It is one persistent redis-server (AOF) under .celery-ha/, shared by every celery-ha process:
    the first process that needs it starts it, the others attach.
    """


def _embedded(obj: CLIContext) -> EmbeddedRedis:
    return EmbeddedRedis(obj.settings.data_dir)


def _client(obj: CLIContext) -> redis.Redis:
    """The shared client, or, for a user that may not PING (ACL), one without the PING check: the
    server answered and took the credentials, which is all "reachable" means here."""
    try:
        return obj.client
    except NoPermissionError:
        return redis_client(obj.redis_url, socket_connect_timeout=5, socket_timeout=30)


def _server_fields(client: redis.Redis, problems: list[str]) -> dict[str, Any]:
    """INFO fields and DBSIZE, each read on its own: an ACL user without +info still gets the key
    count; whatever is refused is added to ``problems`` (one line each) instead of failing."""
    data: dict[str, Any] = {}
    try:
        info = client.info()
        data.update(version=info.get("redis_version"), used_memory=info.get("used_memory_human"),
                    aof_enabled=bool(info.get("aof_enabled")))
    except redis.ResponseError as exc:  # NOPERM and friends; a lost connection still fails the command
        problems.append(f"cannot read INFO (version, memory, AOF): {one_line(str(exc))}")
    try:
        data["keys"] = client.dbsize()
    except redis.ResponseError as exc:
        problems.append(f"cannot read DBSIZE (keys): {one_line(str(exc))}")
    return data


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_cli
def status(obj: CLIContext, as_json: bool) -> None:
    """Show whether Redis runs, where, its pid, data directory, keys and memory.

    Behind Sentinel (a sentinel:// URL): the master the sentinels name, its replicas and their lag,
    and how many sentinels answer. On a Redis Cluster (redis+cluster://): the cluster state and every
    node with its role, keys, memory and version. A Redis user that may not run INFO (or DBSIZE)
    still gets the rest, plus one line per field that could not be read.
    """
    problems: list[str] = []
    if obj.external and is_sentinel_url(obj.redis_url):
        data = {"url": mask_url(obj.redis_url),
                **sentinel_view(obj.redis_url, obj.settings.sentinel_master,
                                obj.settings.sentinel_password or None)}
        data["running"] = data["master"] is not None
        if data["running"]:
            data.update(_server_fields(_client(obj), problems))
        data["replicas"] = "; ".join(data["replicas"]) or "none"
    elif obj.external and is_cluster_client(_client(obj)):
        view = cluster_view(_client(obj))
        data = {"mode": "cluster", "running": True, "reachable": True, "url": mask_url(obj.redis_url),
                "cluster_state": view["cluster_state"], "masters": view["masters"]}
        if as_json:
            data["nodes"] = view["nodes"]
        else:
            for n in view["nodes"]:
                data[n["node"]] = n.get("error") or (f"{n['role']}, {n['keys']} keys, {n['used_memory']}, "
                                                     f"Redis {n['version']}")
    elif obj.external:
        client = _client(obj)
        data = {"mode": "external", "running": True, "reachable": True, "url": mask_url(obj.redis_url),
                **_server_fields(client, problems)}
    else:
        st = _embedded(obj).status()
        problems += st.problems
        data = {"mode": "embedded", **st.as_dict()}
        data.pop("problems", None)
        if st.running and not str(data.get("auth", "password")).startswith("password"):
            problems.append("the embedded Redis has no password (started by an older celery-ha): "
                            "`celery-ha redis stop` then `celery-ha redis start` restarts it secured")
    if data.get("running"):
        policy = eviction_policy(_client(obj))
        data["maxmemory_policy"] = policy or "unknown (CONFIG and INFO refused)"
        warning = eviction_warning(policy)
        if warning:
            data["warning"] = warning
            if not as_json:
                click.echo(f"Warning: {warning}", err=True)
        value = listpack_value(_client(obj))
        data["hash_max_listpack_value"] = "unknown (CONFIG refused)" if value is None else value
        note = compact_records_note(value)
        if note:
            data["memory_note"] = note  # advice, shown in the table: not a problem of this status
    if problems:
        data["problems"] = problems
        if not as_json:
            for problem in problems:
                click.echo(f"Note: {problem}", err=True)
    if as_json:
        echo_json(data)
        return
    if not data["running"]:
        data = {**data,
                "hint": "`celery-ha redis start`, `up` or `demo` start it; other commands attach to it"}
    rows = {k: v for k, v in data.items() if k != "problems"}
    console().print(kv_table(rows, title="Redis"))


@command.command("start")
@pass_cli
def start(obj: CLIContext) -> None:
    """Start the embedded Redis now (demo and up start it on demand; other commands attach to it)."""
    if obj.external:
        raise click.UsageError("CELERY_HA_REDIS_URL/--redis-url names an external Redis; nothing to start")
    url = _embedded(obj).ensure_running()
    click.echo(f"embedded Redis running at {mask_url(url)} (data in {_embedded(obj).data_dir}; "
               "password in redis.password there)")


@command.command("stop")
@pass_cli
def stop(obj: CLIContext) -> None:
    """Stop the embedded Redis (it flushes its AOF first; data survives a restart).

    Stop workers first: they reconnect, and any command would start it again.
    """
    if obj.external:
        raise click.UsageError("CELERY_HA_REDIS_URL/--redis-url names an external Redis; "
                               "celery-ha only stops its embedded one")
    if _embedded(obj).stop():
        click.echo("embedded Redis stopped")
    else:
        click.echo("embedded Redis was not running")
