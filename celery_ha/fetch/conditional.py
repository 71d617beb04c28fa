"""Conditional requests of a task's own page: send the last run's validators, read a 304 as "unchanged".

A recrawl that fetches a page which did not change should cost neither the body nor the items. The
previous run's ``ETag`` (else ``Last-Modified``) is kept per task id (``state/validators.py``); the
next fetch of the task's own URL sends it as ``If-None-Match`` (else ``If-Modified-Since``), and a 304
raises :class:`~celery_ha.fetch.errors.NotModified`, which the runner reads as a completed, unchanged
task. Only one validator is kept: a server must ignore ``If-Modified-Since`` when ``If-None-Match`` is
sent (RFC 9110 13.1.3), so the ETag alone says everything, and a Last-Modified date is kept as epoch
seconds (``e:<etag>`` or ``m:<seconds>``: a few dozen bytes per page).

:class:`PageValidators` is one attempt's view: what it sent, what it saw, and what to remember once
the task completed (never earlier: see ``state/validators.py``).
"""

from __future__ import annotations

import email.utils
import logging
from collections.abc import MutableMapping
from typing import Any

from celery_ha.base.masking import mask_url
from celery_ha.fetch.errors import NotModified
from celery_ha.state.taskqueue import TaskQueue
from celery_ha.state.validators import MAX_VALIDATOR_CHARS, load_validator, store_validator

log = logging.getLogger(__name__)

_CONDITIONAL_HEADERS = ("if-none-match", "if-modified-since", "if-match", "if-unmodified-since",
                        "if-range")


def validator_of(headers: Any) -> str | None:
    """The validator text of a response's headers: ``e:<ETag>``, else ``m:<Last-Modified as epoch
    seconds>``, else None (also for a value too long, not printable ASCII, or an unreadable date)."""
    etag = (headers.get("ETag") or "").strip()
    if etag and len(etag) + 2 <= MAX_VALIDATOR_CHARS and etag.isascii() and etag.isprintable():
        return f"e:{etag}"
    modified = (headers.get("Last-Modified") or "").strip()
    if modified:
        try:
            when = email.utils.parsedate_to_datetime(modified)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is not None:
            return f"m:{int(when.timestamp())}"
    return None


def request_headers(text: str) -> dict[str, str]:
    """The conditional header that validator ``text`` stands for (empty for an unknown form)."""
    kind, _, value = text.partition(":")
    if kind == "e" and value:
        return {"If-None-Match": value}
    if kind == "m" and value.isdigit():
        return {"If-Modified-Since": email.utils.formatdate(int(value), usegmt=True)}
    return {}


class PageValidators:
    """The conditional fetches of one task attempt's own page.

    ``changed``: None until the page was fetched; True after an answer other than 304 (or a first
    fetch with nothing to compare); False after a 304 to the validators sent.
    """

    def __init__(self, queue: TaskQueue, task_id: str, limit: int) -> None:
        self.queue = queue
        self.task_id = task_id
        self.limit = limit
        self.changed: bool | None = None
        self._keep: str | None = None  # the validator to remember at completion (None: keep the stored)

    def prepare(self, kwargs: MutableMapping[str, Any]) -> bool:
        """Add the remembered validator's header to ``kwargs['headers']``, unless the caller sends a
        conditional header of its own; returns whether one was added."""
        if self.limit <= 0:
            return False
        headers = dict(kwargs.get("headers") or {})
        if any(str(name).lower() in _CONDITIONAL_HEADERS for name in headers):
            return False
        text = load_validator(self.queue, self.task_id)
        extra = request_headers(text) if text else {}
        if not extra:
            return False
        headers.update(extra)
        kwargs["headers"] = headers
        return True

    def seen(self, url: str, response: Any, sent: bool) -> None:
        """Read the answer: remember its validator, and raise NotModified for a 304 to ours."""
        status = getattr(response, "status_code", None)
        text = validator_of(getattr(response, "headers", None) or {})
        if sent and status == 304:
            self.changed = False
            self._keep = text  # a 304 may carry a fresher ETag; None keeps the stored one
            raise NotModified(f"{mask_url(url)} not modified since the last run", url=url,
                              response=response)
        if status is not None and 200 <= status < 300:
            self.changed = True
            self._keep = text

    def remember(self) -> None:
        """After the task completed: store the validator seen and count an unchanged completion. A
        failure is logged, never raised (the task's outcome stands; the next fetch is unconditional
        or compares with the older validator, which only costs a full fetch)."""
        if self.limit <= 0 or (self._keep is None and self.changed is not False):
            return
        try:
            store_validator(self.queue, self.task_id, self._keep, self.changed is False, self.limit)
        except Exception as exc:
            log.warning("task %s: its page's validator was not stored: %s", self.task_id, exc)
