"""The namespaces a Redis holds: a registry that processes serving a pattern (``CELERY_HA_NAMESPACES=
crawl-*``) read to find the crawls they serve.

A namespace enters the registry (the set ``cha:namespaces``, outside every namespace's hash tag) at
its first enqueue from a process (one ``SADD`` per queue object, not per task), when a migration
(``celery-ha migrate``) has filled it, and when ``celery-ha namespaces --scan`` finds its keys.
Serving a namespace by name (a worker, beat or ``celery-ha web`` of ``CELERY_HA_NAMESPACE=shop``)
does not register it. Reading it is one ``SMEMBERS``: a worker of a pattern looks every
``CELERY_HA_DISCOVERY_INTERVAL`` seconds instead of scanning the keyspace. A namespace written only
by releases before the registry is found by ``celery-ha namespaces --scan`` (one ``SCAN`` of the
keyspace, which then registers what it found).

:func:`forget` takes a namespace out (``celery-ha purge`` of it); registering is idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.namespace_lists import matches_namespace_pattern
from celery_ha.base.validation import check_namespace
from celery_ha.state.migrate_marks import moved_to
from celery_ha.state.shards import check_count

REGISTRY_KEY = "cha:namespaces"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def register(client: redis.Redis, *namespaces: str) -> None:
    """Add ``namespaces`` to the registry (idempotent)."""
    if namespaces:
        client.sadd(REGISTRY_KEY, *namespaces)


def forget(client: redis.Redis, namespace: str) -> None:
    """Take ``namespace`` out of the registry (it holds nothing any more)."""
    client.srem(REGISTRY_KEY, namespace)


def registered(client: redis.Redis) -> list[str]:
    """Every registered namespace, sorted (entries that are no namespace are skipped)."""
    names = []
    for raw in client.smembers(REGISTRY_KEY):
        name = _text(raw)
        try:
            names.append(check_namespace(name))
        except ValueError:
            continue
    return sorted(names)


def matching(names: Iterable[str], patterns: tuple[str, ...], known: Iterable[str] = ()) -> list[str]:
    """The ``names`` that match one of ``patterns`` and are not in ``known``, sorted."""
    skip = set(known)
    return sorted(n for n in set(names) if n not in skip and matches_namespace_pattern(n, patterns))


def servable_matches(client: redis.Redis, patterns: tuple[str, ...], known: Iterable[str],
                     shards: int, moved_away: bool = False) -> tuple[list[str], dict[str, str]]:
    """The registered namespaces that match ``patterns`` and are not in ``known``, sorted, that a
    process of ``shards`` shards can serve; and, apart, those it cannot, with why: written with another
    shard count (every claim there would be refused: ``state/shards.py`` ``check_count``), or, unless
    ``moved_away`` (a reader such as ``celery-ha web`` shows them), moved away by a migration (its tasks
    run in the target; every claim there is refused, ``state/migrate_marks.py``)."""
    fit: list[str] = []
    refused: dict[str, str] = {}
    for name in matching(registered(client), patterns, known):
        target = None if moved_away else moved_to(client, name)
        if target is not None:
            refused[name] = (f"celery-ha migrate moved (or is moving) namespace {name!r} to {target!r}: its "
                             f"tasks run there")
            continue
        try:
            check_count(client, name, shards)
        except ConfigurationError as exc:
            refused[name] = str(exc)
            continue
        fit.append(name)
    return fit, refused


def scan_for_namespaces(client: redis.Redis, count: int = 1000) -> list[str]:
    """The namespaces whose keys this Redis holds (every master of a cluster), found by one ``SCAN``
    pass over the keyspace: for namespaces written before the registry. O(keys): an operator's
    one-off, never a worker's loop."""
    found: set[str] = set()
    for raw in client.scan_iter(match="cha:{*}:*", count=count):
        key = _text(raw)
        tag = key[key.index("{") + 1:key.index("}")]
        try:
            found.add(check_namespace(tag.split("~", 1)[0]))  # a shard's tag is <namespace>~<i>.<k>
        except ValueError:
            continue
    return sorted(found)
