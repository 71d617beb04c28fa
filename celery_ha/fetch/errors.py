"""What a fetch raises: retryable (:class:`FetchError`) or not (:class:`PermanentFetchError`).

Task runners look only at ``exc.permanent``; the rest (outcome, status, ``retry_after``, the proxies
tried) is for logs and the task's error text. Messages and URLs are masked: a proxy password never
reaches a log line or a task record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_ha.base.errors import CeleryHAError
from celery_ha.base.masking import mask_url


class FetchError(CeleryHAError):
    """Every rotation or the waiting budget ran out: retry the task later (after ``retry_after`` s).

    ``permanent`` is False; task runners only need to look at that flag (``is_permanent``).
    """

    permanent = False

    def __init__(
        self,
        message: str,
        *,
        url: str = "",
        outcome: str = "",
        status: int | None = None,
        retry_after: float = 0.0,
        proxies_tried: Sequence[str] = (),
    ) -> None:
        super().__init__(mask_url(message))
        self.url = mask_url(url)
        self.outcome = outcome
        self.status = status
        self.retry_after = float(retry_after)
        self.proxies_tried = list(proxies_tried)


class PermanentFetchError(FetchError):
    """The page is gone (404/410) or robots.txt forbids it: fail the task without retry."""

    permanent = True

    def __init__(self, message: str, *, url: str = "", status: int | None = None) -> None:
        super().__init__(message, url=url, outcome="permanent", status=status)


class HostNotReady(BaseException):
    """The task's host may not be fetched now: the proxy pool's window or budget for it is spent, it
    answered 429/503, or it is blocked or its spacing would keep a request waiting long
    (``host_pacing.wait_for_turn``). The host gate already holds the host until ``retry_after``
    seconds from now (for every worker); the runner hands the task back at once, counting neither an
    attempt nor a stall, so no pool process sleeps long in a task waiting for a host.

    A BaseException, so task code's ``except Exception`` does not swallow it.
    """

    def __init__(self, message: str, *, host: str, retry_after: float) -> None:
        super().__init__(mask_url(message))
        self.host = host
        self.retry_after = float(retry_after)


class NotModified(BaseException):
    """``ctx.fetch`` of the task's own page answered 304 to the validators of its previous run: the
    page did not change, so the runner completes the task as *unchanged* (its items were committed by
    that run; nothing is emitted again). A task that wants to go on anyway catches it (``response``
    is the 304; ``ctx.changed`` is False) or fetches with ``conditional=False``.

    A BaseException, so task code's ``except Exception`` does not swallow it.
    """

    def __init__(self, message: str, *, url: str, response: Any) -> None:
        super().__init__(mask_url(message))
        self.url = url
        self.response = response


class RobotsDisallowed(PermanentFetchError):
    """robots.txt forbids this URL for our agent."""
