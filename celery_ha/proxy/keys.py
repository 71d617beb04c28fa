"""Redis key names of the proxy pool (under the namespace's common prefix, so one hash tag)."""

from __future__ import annotations

from celery_ha.state.keys import prefix


class ProxyKeys:
    """Prefix for the proxy pool's keys (the pool module names the rest)."""

    def __init__(self, namespace: str) -> None:
        self.prefix = prefix(namespace) + "px:"
