"""The registry of durable tasks: each one's function, logical queue and how its output is keyed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_ha.integration.core.queues import CRAWL


@dataclass
class DurableTask:
    """What ``@durable_task`` records about one task function."""

    name: str
    fn: Callable[..., Any]  # called with a DurableContext
    queue: str = CRAWL  # logical queue; the broker queue is "<namespace>.<queue>"
    item_key: str | None = None
    celery_task: Any = None


#: Every durable task of this process, by name (filled as task modules are imported).
REGISTRY: dict[str, DurableTask] = {}


def is_durable(celery_task: Any) -> bool:
    """Whether a Celery task object is one of ours (by name: the registry fills at import)."""
    return getattr(celery_task, "name", None) in REGISTRY


def logical_queue(task_name: str) -> str:
    """The logical queue of ``task_name``: its ``@durable_task(queue=…)``, ``crawl`` when this process
    did not import the task's module."""
    spec = REGISTRY.get(task_name)
    return spec.queue if spec is not None else CRAWL
