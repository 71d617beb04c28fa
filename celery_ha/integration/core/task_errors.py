"""Exceptions a durable task raises or meets: the names task code imports from one place."""

from __future__ import annotations

from celery_ha.fetch.errors import FetchError, HostNotReady, NotModified, PermanentFetchError

__all__ = ["FetchError", "GracefulStop", "HostNotReady", "NotModified", "PermanentError",
           "PermanentFetchError", "is_permanent"]


class PermanentError(Exception):
    """Raise from a task to fail it without retry (e.g. the input can never be processed)."""

    permanent = True


class GracefulStop(BaseException):
    """Raised inside a running task when the worker shuts down: hand the task back unharmed.

    A BaseException, so task code's ``except Exception`` does not swallow it.
    """


def is_permanent(exc: BaseException) -> bool:
    """True when ``exc`` says retrying cannot help (any exception with ``permanent = True``)."""
    return bool(getattr(exc, "permanent", False))
