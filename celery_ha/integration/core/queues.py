"""Broker queue names per namespace, so two namespaces sharing one broker database never take each
other's messages: namespace ``shop`` sends to and consumes ``shop.crawl`` and ``shop.maintenance``."""

from __future__ import annotations

#: Logical queue of durable fetch work (``@durable_task(queue=...)`` names others).
CRAWL = "crawl"
#: Logical queue of the maintenance jobs (sweep, pump, dead letters, proxy health).
MAINTENANCE = "maintenance"


def broker_queue(namespace: str, logical: str = CRAWL) -> str:
    """The broker queue that carries ``logical`` work of ``namespace``."""
    return f"{namespace}.{logical}"
