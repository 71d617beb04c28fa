"""Lease tokens: the value a proxy × domain lock holds, so only its borrower can free it.

A token is a random per-process prefix plus a counter: unique without a system call per lease
(``os.urandom`` is slow in some sandboxes, and acquire is the hot path). The prefix is held in a
:class:`~celery_ha.base.per_process.PerProcess`, so a forked child draws its own and never hands out
a token its parent also issues.
"""

from __future__ import annotations

import itertools
import secrets

from celery_ha.base.per_process import PerProcess


class _TokenSource:
    """One process's tokens: a random prefix and a counter (``next`` on a count is atomic)."""

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(6)
        self.counter = itertools.count()

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_source: PerProcess[_TokenSource] = PerProcess(_TokenSource)


def new_token() -> str:
    """A lease token unique across every process and every earlier lease of this one."""
    return _source.get().next()
