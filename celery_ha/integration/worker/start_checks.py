"""What stops a worker (or beat) at start-up with one line, and what only warns, before it consumes.

A setting that can only fail later would otherwise fail badly: an extra task module that does not
exist stops Celery with a traceback (:func:`missing_modules`, used when the configuration is read); a
shard count other than the namespace's lets the worker start,
show as alive, and refuse every pump for ever ("pump failed" at each sweep); a state Redis that
refuses the credentials lets it report "ready" and fail at every heartbeat; a worker started with
``-Q`` for the team's own queues runs none of the namespace's tasks (it is told so; it does not count
as one of the namespace's workers).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

import redis
from celery.utils.imports import cwd_in_path

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.integration.core.queues import CRAWL, broker_queue
from celery_ha.integration.core.services import Services
from celery_ha.state.shards import check_count

log = logging.getLogger(__name__)


def missing_modules(names: str) -> list[str]:
    """The modules of ``CELERY_HA_EXTRA_IMPORTS`` (comma-separated) that cannot be imported, looked
    up as Celery will import them (the working directory on the path)."""
    missing = []
    with cwd_in_path():
        for name in filter(None, (n.strip() for n in names.split(","))):
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):  # a parent package that is missing, or a bad name
                found = False
            if not found:
                missing.append(name)
    return missing


def start_refusal(served: Iterable[Services]) -> str | None:
    """The one line a worker or beat stops with, or None: a state Redis that refuses the credentials
    (or, under ACLs, celery-ha's commands) — a configuration error no retry mends; a shard count that
    differs from the one a namespace holds its tasks in (checked now, not at the first pump). An
    unreachable Redis is left to the process's own retries. A missing extra task module or state Redis
    URL is refused earlier, when the app's configuration is read (celery_app/attach.py): Celery imports
    the task modules before any signal."""
    for rt in served:
        try:
            check_count(rt.client, rt.queue.namespace, rt.queue.shard_count)
        except ConfigurationError as exc:
            return str(exc)
        except redis.AuthenticationError as exc:
            return (f"the state Redis at {mask_url(rt.redis_url)} refused the credentials: {exc} (check the "
                    "user and password of CELERY_HA_REDIS_URL, or init_app's redis_url)")
        except redis.exceptions.NoPermissionError as exc:
            return (f"the state Redis at {mask_url(rt.redis_url)} refused celery-ha's commands to this "
                    f"user: {exc} (its ACL must allow them)")
        except redis.RedisError as exc:
            log.warning("could not check namespace %r's shard count now: %s", rt.queue.namespace, exc)
    return None


def queue_warnings(served: Iterable[Services], options: dict[str, Any] | None) -> list[str]:
    """A line for each namespace whose crawl queue a worker started with ``-Q`` does not consume."""
    chosen = (options or {}).get("queues")
    if not chosen:
        return []
    names = set(chosen.split(",") if isinstance(chosen, str) else chosen)
    return [f"this worker consumes none of namespace {rt.settings.namespace!r}'s durable tasks: -Q "
            f"{','.join(sorted(names))} leaves out {broker_queue(rt.settings.namespace, CRAWL)!r} (the "
            "namespace of CELERY_HA_NAMESPACE or init_app(namespace=...)): add it to -Q for this worker to "
            "run them; a worker meant for your other queues only may ignore this, it does not count as "
            "a worker of the namespace"
            for rt in served if broker_queue(rt.settings.namespace, CRAWL) not in names]
