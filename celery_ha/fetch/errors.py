"""What a fetch raises: retryable (:class:`FetchError`) or not (:class:`PermanentFetchError`).

Task runners look only at ``exc.permanent``; the rest (outcome, status, ``retry_after``, the proxies
tried) is for logs and the task's error text. Messages and URLs are masked: a proxy password never
reaches a log line or a task record.
"""

from __future__ import annotations

from collections.abc import Sequence

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


class RobotsDisallowed(PermanentFetchError):
    """robots.txt forbids this URL for our agent."""
