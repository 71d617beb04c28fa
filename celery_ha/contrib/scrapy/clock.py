"""Waiting inside Scrapy without blocking it: a non-blocking pause and a repeating call.

Both use Scrapy's own helpers where the installed Scrapy has them (they also work without a Twisted
reactor, Scrapy's asyncio-only mode) and fall back to Twisted's ``deferLater`` / ``LoopingCall``
otherwise. ``time.sleep`` would freeze every download of the crawl, not just the waiting request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

try:  # Scrapy >= 2.18
    from scrapy.utils.asyncio import sleep as _scrapy_sleep
except ImportError:  # pragma: no cover - older Scrapy
    _scrapy_sleep = None
try:  # Scrapy >= 2.14
    from scrapy.utils.asyncio import create_looping_call as _scrapy_looping_call
except ImportError:  # pragma: no cover - older Scrapy
    _scrapy_looping_call = None


class Looping(Protocol):
    """What both looping-call flavours offer."""

    def start(self, interval: float, now: bool = True) -> Any: ...

    def stop(self) -> None: ...

    @property
    def running(self) -> bool: ...


async def pause(seconds: float) -> None:
    """Let ``seconds`` pass while the reactor keeps serving every other request."""
    if seconds <= 0:
        return
    if _scrapy_sleep is not None:
        await _scrapy_sleep(seconds)
        return
    # Imported here: importing twisted.internet.reactor at module level would install a reactor
    # before Scrapy chooses one.
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    await maybe_deferred_to_future(deferLater(reactor, seconds))  # type: ignore[arg-type]


def looping_call(func: Callable[[], None]) -> Looping:
    """A repeating call of ``func`` on the crawl's event loop (``start(interval)`` / ``stop()``)."""
    if _scrapy_looping_call is not None:
        return _scrapy_looping_call(func)  # type: ignore[return-value]
    from twisted.internet.task import LoopingCall

    return LoopingCall(func)  # type: ignore[return-value]
