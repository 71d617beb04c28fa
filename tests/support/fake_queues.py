"""The part of a Celery app's ``amqp.queues`` that ``HeldProducer.declare`` uses, for the unit tests
whose app records messages instead of publishing them."""

from __future__ import annotations

import collections
from types import SimpleNamespace


class BindableQueue:
    """A queue that records the channel it was bound to."""

    channel: object = None

    def bind(self, channel: object) -> BindableQueue:
        bound = BindableQueue()
        bound.channel = channel
        return bound


def fake_amqp() -> SimpleNamespace:
    """``app.amqp`` with a ``queues`` mapping that makes any queue name on first use, as Celery's does."""
    return SimpleNamespace(queues=collections.defaultdict(BindableQueue))
