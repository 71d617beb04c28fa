"""A consumer bootstep that looks at a message of chosen task names before Celery runs it, and may
take it away: the hook behind celery-ha's refusal to run a plain Celery task for a durable task's
message (``integration/task_api/misuse.py``).

Celery's consumer turns a message into a request for the pool through the *strategy* of its task
name: ``Consumer.strategies`` (a dict, name -> callable), filled by ``update_strategies`` in the
consumer's ``Tasks`` step each time the consumer starts (at start-up and after every reconnect), and
called as ``strategy(message, body, ack, reject, callbacks)``. No signal can stop a message there
(``task_received`` comes after the request is made, ``task_prerun`` in the pool). A step that
requires ``Tasks`` starts after it every time, and wraps the strategy of each name :meth:`guards`
picks: the wrapper first asks :meth:`intercept`, which either leaves the message to Celery (False)
or has dealt with it, acknowledged or rejected, itself (True).

``Consumer.strategies`` is an internal of Celery. A consumer without it (a release that renamed
it) is left alone, with one WARNING: the messages then run as Celery decides. A strategy reloaded
without a consumer restart (the ``pool_restart`` control command with ``reload``) runs unguarded
until the next restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from celery_ha.integration.patches import registry

log = logging.getLogger(__name__)

NAME = "strategy_guard"
#: The releases this was verified on.
VERIFIED = "celery 5.6.3-5.7.0"
_MARK = "_celery_ha_guarded"  # on a wrapper: never wrapped twice


class StrategyGuard(bootsteps.StartStopStep):
    """See the module docstring; a subclass says which names it guards and what it does."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    #: What is lost when the guard cannot be put in place (the subclass says it).
    without = "messages run as Celery decides"

    def guards(self, name: str) -> bool:
        """Whether messages of task ``name`` go through :meth:`intercept` first."""
        return False

    def intercept(self, consumer: Any, message: Any, name: str) -> bool:
        """Deal with ``message`` (True: acknowledged or rejected here, Celery never sees it) or leave
        it to Celery (False). Runs in the consumer's event loop: keep it short."""
        return False

    def start(self, c: Any) -> None:
        self.decide(c)

    def decide(self, c: Any) -> bool:
        """Wrap the strategies of the guarded names; returns whether the guard is on."""
        strategies = getattr(c, "strategies", None)
        if not isinstance(strategies, dict):
            registry.switched_off(NAME, VERIFIED, f"{registry.installed('celery')}: the consumer has no "
                                  f"'strategies' dict to guard: {self.without}")
            return False
        for name, strategy in list(strategies.items()):
            if callable(strategy) and not getattr(strategy, _MARK, False) and self.guards(name):
                strategies[name] = self._wrap(c, name, strategy)
        registry.applied(NAME, VERIFIED)
        return True

    def _wrap(self, consumer: Any, name: str, strategy: Callable[..., Any]) -> Callable[..., Any]:
        intercept = self.intercept

        def guarded(message: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                taken = intercept(consumer, message, name)
            except Exception:  # a fault of the guard never stops the consumer: Celery decides
                log.exception("celery-ha %s: could not look at a message of %r", NAME, name)
                taken = False
            return None if taken else strategy(message, *args, **kwargs)

        setattr(guarded, _MARK, True)
        return guarded
