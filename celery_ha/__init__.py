"""celery-ha: high-availability crawl orchestration for Celery.

The durable state (tasks, leases, checkpoints, outputs, proxies) lives in Redis and changes only
through atomic Lua scripts; Celery is the transport and the clock. ``celery -A celery_ha worker``
finds the ready-made Celery app here as ``celery_ha.app``; ``celery_ha.init_app(app)`` attaches
celery-ha to an app of your own. The app, the proxy pool and the task decorator are imported lazily,
so using the queue alone never imports Celery.
"""

from __future__ import annotations

from typing import Any

from celery_ha.base.errors import (
    CeleryHAError,
    ConfigurationError,
    InvalidInput,
    LeaseLost,
    NoProxyAvailable,
    PayloadTooLarge,
    TaskNotFound,
)
from celery_ha.state import Lease, TaskInfo, TaskQueue

__version__ = "0.1.0"
__all__ = [
    "CeleryHAError",
    "ConfigurationError",
    "DurableContext",
    "InvalidInput",
    "Lease",
    "LeaseLost",
    "NoProxyAvailable",
    "PayloadTooLarge",
    "PermanentError",
    "ProxyPool",
    "TaskInfo",
    "TaskNotFound",
    "TaskQueue",
    "app",
    "durable_task",
    "init_app",
    "pump_now",
]

_LAZY = {
    "ProxyPool": ("celery_ha.proxy", "ProxyPool"),
    "durable_task": ("celery_ha.integration", "durable_task"),
    "DurableContext": ("celery_ha.integration", "DurableContext"),
    "PermanentError": ("celery_ha.integration", "PermanentError"),
    "app": ("celery_ha.celery_app.ready", "app"),
    "celery": ("celery_ha.celery_app.ready", "app"),
    "init_app": ("celery_ha.celery_app", "init_app"),
    "pump_now": ("celery_ha.celery_app", "pump_now"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'celery_ha' has no attribute {name!r}")
