"""Typed errors raised by celery-ha.

Every error a caller can provoke with bad input is a subclass of :class:`CeleryHAError`, so a CLI or a
Django view can catch one base class and print a one-line message instead of a traceback.
"""

from __future__ import annotations


class CeleryHAError(Exception):
    """Base class of every error celery-ha raises on purpose."""


class InvalidInput(CeleryHAError, ValueError):
    """The caller passed something celery-ha refuses to store (nothing was written)."""


class PayloadTooLarge(InvalidInput):
    """A user-supplied payload (URL, meta, checkpoint, item) exceeds its size cap."""


class TaskNotFound(CeleryHAError, KeyError):
    """No task with that id exists in this namespace."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a plain sentence.
        return str(self.args[0]) if self.args else "task not found"


class LeaseLost(CeleryHAError):
    """The caller's lease is no longer current: the task was reclaimed, re-claimed or finished.

    A holder that gets this must stop touching the task at once; nothing it writes is accepted.
    ``code`` is the script's refusal code (``celery_ha.state.replies.Refusal``) when the state layer
    refused a write, ``reason`` the same in words; both are None for a lease given up locally (a
    renewal that kept failing).
    """

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class ConfigurationError(CeleryHAError):
    """A setting (environment variable, Django setting or argument) has a bad value."""


class NoProxyAvailable(CeleryHAError):
    """No proxy can serve this domain right now; ``retry_after`` says when one may (seconds)."""

    def __init__(self, message: str = "no proxy available", retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = float(retry_after)
