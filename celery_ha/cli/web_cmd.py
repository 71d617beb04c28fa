"""``celery-ha web``: Prometheus metrics, the live dashboard and its JSON API, from the state in Redis."""

from __future__ import annotations

import dataclasses
import re
import signal
from types import FrameType
from typing import Any

import click

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.namespace_lists import (
    MAX_SERVED_NAMESPACES,
    namespace_names,
    namespace_patterns,
    parse_namespaces,
)
from celery_ha.base.settings import Settings
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.monitoring.auth import BasicAuth
from celery_ha.monitoring.broker_depth import broker_reader
from celery_ha.monitoring.collector import Source
from celery_ha.monitoring.dashboard import Reader
from celery_ha.monitoring.server import WebApp, WebServer, bind_address, is_loopback
from celery_ha.state.namespaces import servable_matches
from celery_ha.state.record_store import record_count
from celery_ha.state.shards import shard_keys, stored_count


def _auth_option(_ctx: click.Context, _param: Any, value: str | None) -> BasicAuth | None:
    """click callback: USER:PASSWORD; the message never repeats the value (it holds a password)."""
    if not value:
        return None
    try:
        return BasicAuth.parse(value)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc)) from None


def _namespaces_option(_ctx: click.Context, _param: Any, value: str | None) -> tuple[str, ...]:
    """click callback: ``shop,news`` -> the namespaces served (each checked; one line when bad)."""
    if not value:
        return ()
    try:
        return parse_namespaces("--namespaces", value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc).removeprefix("--namespaces=")) from None


def _hosts_option(_ctx: click.Context, _param: Any, value: str | None) -> tuple[str, ...]:
    """click callback: ``dash.example.com,web`` -> the host names a request's Host may name."""
    names = tuple(n.strip().lower().rstrip(".") for n in (value or "").split(",") if n.strip())
    for name in names:
        if not _HOST_NAME.fullmatch(name):
            raise click.BadParameter(f"{name[:80]!r} is not a host name (letters, digits, '-', '_', '.')")
    return names


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*")


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _reader_shards(client: Any, namespace: str, configured: int) -> int:
    """The shard count the web reads ``namespace`` with: the one it is stored in (one server may show
    namespaces of several counts: a migration's target beside the others; a reader never needs the
    process's own), or, while it holds nothing yet, the process's (CELERY_HA_SHARDS: what its workers
    will write it with)."""
    stored = stored_count(client, namespace)
    if stored == configured or stored > 1:  # recorded (1 is not): its processes run with it
        return stored
    shard = shard_keys(namespace, 1)[0]
    return stored if record_count(client, shard) or client.hlen(shard.items) else configured


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the dashboard: it needs --auth "
                   "(or --insecure-no-auth).")
@click.option("--allowed-hosts", "allowed_hosts", metavar="NAME[,NAME...]", callback=_hosts_option,
              help="Host names the server answers besides loopback ones and IP addresses (its DNS name "
                   "behind a proxy, a compose service name): any other Host header is refused (421), "
                   "so a web page cannot reach the server through DNS rebinding.")
@click.option("--insecure-no-auth", is_flag=True,
              help="Listen beyond loopback without --auth: anyone who can reach the port reads the "
                   "dashboard and /metrics. Without this flag that is refused.")
@click.option("--port", type=click.IntRange(0, 65535), default=8808, show_default=True,
              help="Port to listen on (0: any free port, printed at start).")
@click.option("--auth", "auth", metavar="USER:PASSWORD", default=lambda: Settings.one("web_auth") or None,
              show_default="$CELERY_HA_WEB_AUTH",
              callback=_auth_option, expose_value=True,
              help="Basic auth for every page; also enables the dashboard's actions (redrive, unban). "
                   "Prefer the environment variable: a command line is visible to every local user.")
@click.option("--queue", "queues", multiple=True, metavar="NAME",
              help="Also count broker messages of this @durable_task(queue=NAME) queue (repeatable).")
@click.option("--namespaces", "namespaces", metavar="NS[,NS...]", callback=_namespaces_option,
              default=lambda: ",".join(Settings.one("web_namespaces") or Settings.one("namespaces")) or None,
              show_default="$CELERY_HA_WEB_NAMESPACES, else $CELERY_HA_NAMESPACES (the workers'), "
                           "else the -n namespace",
              help="Serve several namespaces of this Redis: /metrics holds all of them (label "
                   "namespace), the dashboard and the API show one each with ?namespace=NS (the first "
                   "by default). A pattern ('crawl-*', '*') serves every registered namespace it "
                   "matches, also those that appear later.")
@pass_cli
def command(obj: CLIContext, host: str, port: int, allowed_hosts: tuple[str, ...], insecure_no_auth: bool,
            auth: BasicAuth | None, queues: tuple[str, ...], namespaces: tuple[str, ...]) -> None:
    """Serve /metrics (Prometheus), / (the live dashboard), /api/stats and /healthz.

    Every request reads the namespace's state in Redis; the process keeps nothing, so run as many as
    you like. Counts come from the task layer's own scripts: standalone and Celery workers both count,
    no Celery events are needed. With --namespaces one server covers several crawls of one Redis.
    """
    from celery_ha.proxy import ProxyPool
    from celery_ha.state import TaskQueue

    try:  # decided on the address bind() will use: 127.1 and ::ffff:127.0.0.1 are loopback, "" is not
        exposed = not is_loopback(str(bind_address(host)[1][0]))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if exposed and auth is None and not insecure_no_auth:
        raise click.UsageError(f"listening on {host or 'every address'} needs --auth USER:PASSWORD (or "
                               "CELERY_HA_WEB_AUTH); --insecure-no-auth serves it to anyone who can reach it")
    client = obj.client  # an unreachable Redis is one clear line now, not a 503 later
    settings = obj.settings
    patterns = namespace_patterns(namespaces)

    def serve(ns: str) -> tuple[Reader, Source]:
        own = dataclasses.replace(settings, shards=_reader_shards(client, ns, settings.shards))
        return (Reader(client, TaskQueue.for_settings(client, own, ns), ProxyPool(client, ns),
                       worker_max_age=settings.lease_ttl),
                Source(client, ns, settings.lease_ttl,
                       broker_reader(settings, obj.redis_url, client, ns, queues)))

    said: set[str] = set()  # matches of another shard count, said once each

    def grow(known: set[str]) -> list[tuple[Reader, Source]]:
        found, refused = servable_matches(client, patterns, known, settings.shards, moved_away=True)
        for ns in sorted(set(refused) - said):
            click.echo(f"celery-ha web: not serving namespace {ns}: {refused[ns]}", err=True)
        said.update(refused)
        return [serve(ns) for ns in found[:max(0, MAX_SERVED_NAMESPACES - len(known))]]

    names = namespace_names(namespaces)
    served = [serve(ns) for ns in names]
    served += grow(set(names)) if patterns else []
    served = served or [serve(obj.namespace)]  # patterns with no match yet: the -n namespace first
    readers, sources = [r for r, _ in served], [s for _, s in served]
    source = sources[0]
    try:
        app = WebApp(readers, sources, auth, allowed_hosts, grow=grow if patterns else None,
                     grow_every=settings.discovery_interval)
        server = WebServer(app, host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. a host that is no address or name
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None
    login = f"basic auth, user {auth.user}" if auth else "no auth, read-only"
    shown = f"namespace {readers[0].namespace}" if len(readers) == 1 else \
        f"namespaces {', '.join(r.namespace for r in readers)}"
    if patterns:
        shown += f", and those matching {','.join(patterns)} as they appear"
    click.echo(f"celery-ha web: {server.url} ({login}; {shown}, Redis {mask_url(obj.redis_url)})")
    if source.broker is None:
        click.echo("  the broker is not Redis: celery_ha_broker_messages is left out")
    if auth is None and not server.loopback:  # only with --insecure-no-auth (refused above otherwise)
        click.echo(f"Warning: listening on {server.url} without --auth (--insecure-no-auth): anyone who "
                   "can reach it sees the dashboard", err=True)
    old = signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        server.server_close()
    click.echo("celery-ha web stopped")
