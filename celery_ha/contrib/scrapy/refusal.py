"""A configuration error stops the crawl at start with one line naming it, and a non-zero exit.

Both middlewares read their settings when Scrapy builds them (``from_crawler``), inside the crawl's
start-up. Two ways out were not good enough:

* ``NotConfigured`` would only switch the middleware off: the spider would then crawl *without* the
  pool, straight from this machine's IP, which is what the settings were meant to prevent;
* letting the :class:`ConfigurationError` escape stops the crawl and makes ``scrapy crawl`` exit 1,
  but asyncio then reports the failed crawl task with a 30-line traceback ("Task exception was never
  retrieved") that buries the one line that matters.

So the error is logged as one masked line and re-raised (the crawl stops before any request, Scrapy
marks the start-up failed and ``scrapy crawl`` exits 1; a script driving ``CrawlerRunner`` can still
catch the ConfigurationError), and the crawl's asyncio task is told that this exception was seen, so
asyncio does not print it a second time. Under a Twisted reactor without asyncio there is no task:
Twisted then prints the failure itself, after the same one line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url

log = logging.getLogger("celery_ha.contrib.scrapy")


def one_line(exc: BaseException) -> str:
    """The error's message on one line, any credentials in URLs masked."""
    parts = [part.strip() for part in mask_url(str(exc)).splitlines() if part.strip()]
    return " | ".join(parts) or type(exc).__name__


def _seen_by_us(exc: BaseException) -> None:
    """Mark ``exc`` as handled once the running asyncio task ends with it, so asyncio's "exception
    was never retrieved" report (with its traceback) is not printed; any other ending is reported
    as asyncio would have reported it."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop: a Twisted reactor without asyncio
        return
    if task is None:
        return

    def done(finished: asyncio.Task[Any]) -> None:
        if finished.cancelled():
            return
        ended_with = finished.exception()  # retrieving it is what keeps asyncio quiet
        if ended_with is not None and ended_with is not exc:
            finished.get_loop().call_exception_handler(
                {"message": "Task exception was never retrieved", "exception": ended_with,
                 "future": finished}
            )

    task.add_done_callback(done)


def refuse_to_start(exc: ConfigurationError) -> NoReturn:
    """Stop the crawl at start because of ``exc``: one ERROR line, then the error re-raised."""
    log.error("celery-ha: %s", one_line(exc))
    _seen_by_us(exc)
    raise exc
