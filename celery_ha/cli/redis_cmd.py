"""``celery-ha redis status|start|stop``: look after the embedded Redis."""

from __future__ import annotations

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.render import console, echo_json, kv_table
from celery_ha.redisio.memory_policy import eviction_policy, eviction_warning
from celery_ha.redisio.sentinel import is_sentinel_url, sentinel_view
from celery_ha.redisio.urls import mask_url
from celery_ha.runtime.embedded import EmbeddedRedis


@click.group("redis")
def command() -> None:
    """Manage the embedded Redis (used when CELERY_HA_REDIS_URL is unset).

    It is one persistent redis-server (AOF) under .celery-ha/, shared by every celery-ha process:
    the first process that needs it starts it, the others attach.
    """


def _embedded(obj: CLIContext) -> EmbeddedRedis:
    return EmbeddedRedis(obj.settings.data_dir)


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_cli
def status(obj: CLIContext, as_json: bool) -> None:
    """Show whether Redis runs, where, its pid, data directory, keys and memory.

    Behind Sentinel (a sentinel:// URL): the master the sentinels name, its replicas and their lag,
    and how many sentinels answer.
    """
    if obj.external and is_sentinel_url(obj.redis_url):
        data = {"url": mask_url(obj.redis_url),
                **sentinel_view(obj.redis_url, obj.settings.sentinel_master,
                                obj.settings.sentinel_password or None)}
        data["running"] = data["master"] is not None
        if data["running"]:
            info = obj.client.info()
            data.update(version=info.get("redis_version"), keys=obj.client.dbsize(),
                        used_memory=info.get("used_memory_human"), aof_enabled=bool(info.get("aof_enabled")))
        data["replicas"] = "; ".join(data["replicas"]) or "none"
    elif obj.external:
        info = obj.client.info()
        data = {"mode": "external", "running": True, "url": mask_url(obj.redis_url),
                "version": info.get("redis_version"), "keys": obj.client.dbsize(),
                "used_memory": info.get("used_memory_human"),
                "aof_enabled": bool(info.get("aof_enabled"))}
    else:
        data = {"mode": "embedded", **_embedded(obj).status().as_dict()}
    if data.get("running"):
        policy = eviction_policy(obj.client)
        data["maxmemory_policy"] = policy or "unknown (CONFIG and INFO refused)"
        warning = eviction_warning(policy)
        if warning:
            data["warning"] = warning
            if not as_json:
                click.echo(f"Warning: {warning}", err=True)
    if as_json:
        echo_json(data)
        return
    if not data["running"]:
        data = {**data, "hint": "starts on demand with any celery-ha command, or `celery-ha redis start`"}
    console().print(kv_table(data, title="Redis"))


@command.command("start")
@pass_cli
def start(obj: CLIContext) -> None:
    """Start the embedded Redis now (any command would start it on demand anyway)."""
    if obj.external:
        raise click.UsageError("CELERY_HA_REDIS_URL/--redis-url names an external Redis; nothing to start")
    url = _embedded(obj).ensure_running()
    click.echo(f"embedded Redis running at {url} (data in {_embedded(obj).data_dir})")


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
