"""celery-ha as a Django app (``pip install 'celery-ha[django]'``).

Add ``"celery_ha.contrib.django"`` to ``INSTALLED_APPS``, configure it with the ``CELERY_HA`` dict
and ``python manage.py migrate`` (the outbox table). Then, in a view::

    from celery_ha.contrib.django import enqueue_on_commit

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue_on_commit(order.url, task="crawl_list")   # queued when (and only if) this commits

The names are resolved lazily: importing this package (as ``INSTALLED_APPS`` does, before Django's
app registry is ready) loads neither models nor Redis clients.
"""

from __future__ import annotations

from typing import Any

__all__ = ["enqueue_many_on_commit", "enqueue_on_commit", "relay"]


def __getattr__(name: str) -> Any:
    if name in ("enqueue_on_commit", "enqueue_many_on_commit"):
        from celery_ha.contrib.django import on_commit

        return getattr(on_commit, name)
    if name == "relay":
        from celery_ha.contrib.django import outbox

        return outbox.relay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
