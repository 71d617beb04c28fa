"""Which served namespaces' durable tasks this worker can run, by the broker queues it consumes.

A team that attaches celery-ha to its own Celery app may start workers of its own queues only
(``celery worker -Q emails``). Such a worker serves the namespace's settings (its tasks may enqueue),
but it runs none of the namespace's durable tasks; were its pool processes to heartbeat the worker
registry, they would be counted as live workers of the namespace: in the broker window (more messages
sent than there are consumers for them) and by ``celery-ha workers`` and the CLI's pump hint. The
worker's ``-Q`` / ``-X`` are recorded here at start-up (``celeryd_init``, before the pool forks, so
every pool process inherits them) and read when the lease keeper heartbeats
(``running/lease_keeper.py``), by which time every task module is imported.

A namespace served by a pattern (``CELERY_HA_NAMESPACES=crawl-*``) is consumed as the worker's own is:
discovery mirrors the own namespace's queues (``worker/discovery.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_ha.integration.core.queues import CRAWL, broker_queue
from celery_ha.integration.core.task_spec import REGISTRY

#: The broker queues named by ``-Q`` (None: no ``-Q``, every queue) and by ``-X``, per process.
_chosen: frozenset[str] | None = None
_excluded: frozenset[str] = frozenset()


def _names(value: Any) -> frozenset[str]:
    if not value:
        return frozenset()
    items: Iterable[str] = value.split(",") if isinstance(value, str) else value
    return frozenset(name.strip() for name in items if name and name.strip())


def record_worker_queues(options: dict[str, Any] | None) -> None:
    """Note the worker's ``-Q`` (``queues``) and ``-X`` (``exclude_queues``) options."""
    global _chosen, _excluded
    options = options or {}
    _chosen = _names(options.get("queues")) or None
    _excluded = _names(options.get("exclude_queues"))


def durable_logical_queues() -> set[str]:
    """The logical queues durable tasks are sent to: ``crawl`` and each ``@durable_task(queue=...)``."""
    return {CRAWL, *(spec.queue for spec in REGISTRY.values())}


def _consumes(queue: str) -> bool:
    return (_chosen is None or queue in _chosen) and queue not in _excluded


def runs_durable_tasks(namespace: str, own_namespace: str, named: Iterable[str]) -> bool:
    """Whether this process consumes a broker queue of ``namespace``'s durable tasks. ``named``: the
    namespaces the settings name (the others are served by a pattern, with the own namespace's
    queues)."""
    if _chosen is None and not _excluded:
        return True
    consumed_as = namespace if namespace in set(named) else own_namespace
    return any(_consumes(broker_queue(consumed_as, logical)) for logical in durable_logical_queues())
