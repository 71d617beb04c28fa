"""A value built once per process: the fork-safe cache every per-process singleton uses.

A prefork pool child inherits its parent's memory, sockets and (dead) threads. Anything that owns a
socket or a thread (Redis clients, the lease keeper, the fetcher's HTTP session) must therefore be
built anew in the child. :class:`PerProcess` keys the value by pid, so the first use after a fork
builds a fresh one; building is serialized per process, so two threads never build it twice.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``cache.get()`` returns this process's value, calling ``factory()`` on first use after a fork.

    ``valid`` (optional) is asked on every hit; a value it rejects (a stopped thread, say) is rebuilt.
    """

    def __init__(self, factory: Callable[[], T], valid: Callable[[T], bool] | None = None) -> None:
        self._factory = factory
        self._valid = valid
        self._pid = 0
        self._value: T | None = None
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def _process_lock(self) -> threading.Lock:
        # A lock held by a parent's thread at fork time stays held forever in the child: a child
        # (alone in its process at first) takes a lock of its own.
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def _current(self) -> T | None:
        value = self._value
        if self._pid == os.getpid() and value is not None and (self._valid is None or self._valid(value)):
            return value
        return None

    def get(self) -> T:
        value = self._current()
        if value is not None:
            return value
        with self._process_lock():
            value = self._current()
            if value is None:
                value = self._factory()
                self._value, self._pid = value, os.getpid()
            return value

    def peek(self) -> T | None:
        """This process's value if it was built (never builds one)."""
        return self._current()

    def set(self, value: T) -> None:
        """Install ``value`` as this process's (tests, or a process that builds its own)."""
        with self._process_lock():
            self._value, self._pid = value, os.getpid()

    def reset(self) -> None:
        """Forget the value (tests that change the environment)."""
        with self._process_lock():
            self._value, self._pid = None, 0
