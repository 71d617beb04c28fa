"""celery-ha: high-availability crawl orchestration for Celery.

The durable state (tasks, leases, checkpoints, outputs, proxies) lives in Redis and changes only
through atomic Lua scripts; Celery is the transport and the clock. ``celery -A celery_ha worker``
finds the Celery app here as ``celery_ha.app`` (imported lazily, so using the queue alone does not
import Celery).
"""

from __future__ import annotations

from typing import Any

from .errors import (
    CeleryHAError,
    ConfigurationError,
    InvalidInput,
    LeaseLost,
    NoProxyAvailable,
    PayloadTooLarge,
    TaskNotFound,
)
from .queue import Lease, TaskInfo, TaskQueue

__version__ = "0.1.0"
__all__ = [
    "CeleryHAError",
    "ConfigurationError",
    "InvalidInput",
    "Lease",
    "LeaseLost",
    "NoProxyAvailable",
    "PayloadTooLarge",
    "ProxyPool",
    "TaskInfo",
    "TaskNotFound",
    "TaskQueue",
    "app",
]


def __getattr__(name: str) -> Any:
    if name == "ProxyPool":
        from .proxy import ProxyPool

        return ProxyPool
    if name in ("app", "celery"):
        from .celery_app import app

        return app
    raise AttributeError(f"module 'celery_ha' has no attribute {name!r}")
