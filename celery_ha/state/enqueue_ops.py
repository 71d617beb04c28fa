"""Enqueueing (``enqueue``, ``enqueue_many``, ``task_ids``), as a base class of
:class:`~celery_ha.state.taskqueue.TaskQueue`: specs are checked and packed first
(:mod:`celery_ha.state.enqueue_args`), then written by ``enqueue.lua`` in batches of
``SCRIPT_BATCH`` rows, one round trip per shard a batch touches. The server decides dedup
atomically; a host key made under a key mode no longer in force is refused by the script and the
rows are keyed again (the mode changed while this process held an old copy).

``enqueue`` and ``enqueue_many`` refuse a task name that the namespace's live workers do not run as
a ``@durable_task`` (a plain Celery task's name, a typo), as ``celery-ha enqueue`` does: such a task
would never run (or, for a plain task's name, the worker refuses its message and the task ends
dead). The names are those the workers registered (``state/worker_registry.py``), read in one round
trip once per KNOWN_TASKS_TTL per queue object, and again when a name is missing; the queue's
``default_task`` (configuration, ``fetch_page`` unless set) costs no read. With no live worker any
name is accepted (enqueueing ahead of a deployment), and ``allow_unknown_task=True`` accepts one the
workers do not run yet. ``enqueue_many_with_status`` does not check: ``celery-ha enqueue`` and
sitemap ingestion, which call it, check the name themselves, with their own override.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import redis

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.tracing import capture
from celery_ha.base.urls import UrlRules
from celery_ha.base.validation import shown
from celery_ha.state.carried import (
    ANCESTORS_FIELD,
    Carry,
    carried_duplicates,
    carried_times,
    count_duplicates,
    parse_carries,
)
from celery_ha.state.carried import META_FIELD as CARRY_FIELD
from celery_ha.state.enqueue_args import (
    MAX_BATCH,
    SCRIPT_BATCH,
    Row,
    RowDefaults,
    build_rows,
    grouped,
    on_host_shard,
    rekey,
)
from celery_ha.state.hosts import HostGate
from celery_ha.state.ids import random_id
from celery_ha.state.keys import QueueKeys
from celery_ha.state.namespaces import register
from celery_ha.state.operator_ops import expiry_ms
from celery_ha.state.sharded import by_shard
from celery_ha.state.url_rules import check_rules_reading, set_rules
from celery_ha.state.worker_registry import known_task_names

#: Seconds a queue goes on with the carried ancestors it read before reading them again.
CARRY_TTL = 60.0
#: The meta field ``celery-ha migrate`` sets in the namespace it migrated from (state/migrate.py).
MIGRATED_TO = "migrated_to"
#: The meta fields of a namespace's migration lineage, read together (state/carried.py), and where
#: it was migrated to, if it was.
LINEAGE = (CARRY_FIELD, ANCESTORS_FIELD, MIGRATED_TO)
#: Seconds a queue goes on with the task names of the live workers it read before reading them again
#: (a name it does not find there is read again at once: a worker that just started may run it).
KNOWN_TASKS_TTL = 30.0

_unchecked: ContextVar[bool] = ContextVar("celery_ha_task_names_unchecked", default=False)


@contextmanager
def task_names_unchecked() -> Iterator[None]:
    """Within it, ``enqueue`` and ``enqueue_many`` do not check task names against the live workers:
    the runner of a durable task holds it, since the children a task queues are written at its
    checkpoint or completion, where a refusal would fail celery-ha's own step, not the task's call."""
    token = _unchecked.set(True)
    try:
        yield
    finally:
        _unchecked.reset(token)


class EnqueueOps:
    """Enqueueing of one namespace (every shard); TaskQueue provides the attributes."""

    client: redis.Redis
    namespace: str
    keys: QueueKeys  # shard 0's (the namespace's own tag: its meta hash)
    shard_count: int
    shard_keys: Callable[[], list[QueueKeys]]
    default_task: str
    max_attempts: int
    max_stalls: int
    meta_cap: int
    host_gate: bool
    dedup_ttl: float | None
    url_rules: UrlRules
    _rules_checked: bool
    _carries: list[Carry] | None  # ancestors whose remembered ids the namespace carries (None: not read)
    _ancestors: list[Carry] | None  # ancestors whose dedup ids meant something else (meta 'ancestors')
    _carries_at: float  # when both were read (monotonic)
    _moved_to: str | None  # the namespace a migration moved this one's tasks to (meta 'migrated_to')
    _registered: bool
    _key_mode: str | None
    _key_mode_at: float
    _run: Callable[..., Any]
    hosts: HostGate  # TaskQueue's property (a gate made on each use)
    lease_ttl: float
    # The task names the namespace's live workers run (None: no live worker), and when they were
    # read (monotonic); class defaults until the first read.
    _known_tasks: set[str] | None = None
    _known_tasks_at: float = float("-inf")

    def enqueue(self, url: str, task: str | None = None, priority: int = 0,
                meta: Mapping[str, Any] | None = None, dedup: bool = True,
                max_attempts: int | None = None, max_stalls: int | None = None,
                recrawl_after: float | str | None = None, host: str | None = None,
                allow_unknown_task: bool = False) -> str:
        """Queue one task and return its id; a duplicate (same task + canonical URL, live or finished
        less than ``recrawl_after`` ago, default the queue's ``dedup_ttl``) returns the existing id and
        counts in ``stats()['duplicates']``. ``host``: the task's host key for the host gate (default
        the URL's host; "" = none). InvalidInput when live workers of the namespace run no durable
        task named ``task`` (a plain Celery task's name, a typo), unless ``allow_unknown_task``."""
        return self.enqueue_many([{"url": url, "task": task, "priority": priority, "meta": meta,
                                   "dedup": dedup, "max_attempts": max_attempts,
                                   "max_stalls": max_stalls, "host": host}], recrawl_after=recrawl_after,
                                 allow_unknown_task=allow_unknown_task)[0]

    def enqueue_many(self, specs: Iterable[str | Mapping[str, Any]], *, task: str | None = None,
                     priority: int = 0, dedup: bool = True, batch_size: int = SCRIPT_BATCH,
                     recrawl_after: float | str | None = None, allow_unknown_task: bool = False) -> list[str]:
        """Queue many tasks, one round trip per batch. Each spec is a URL or a dict with the keyword
        arguments of :meth:`enqueue` (but ``recrawl_after`` and ``allow_unknown_task``, which are the
        call's). Every spec is validated, and every task name checked as :meth:`enqueue` does, before
        anything is written."""
        return [tid for tid, _ in self._enqueue(
            specs, task, priority, dedup, batch_size, recrawl_after, check_names=not allow_unknown_task)]

    def task_ids(self, specs: Iterable[str | Mapping[str, Any]], *, task: str | None = None,
                 priority: int = 0, dedup: bool = True) -> list[str]:
        """Validate specs exactly as :meth:`enqueue_many` does and return the ids they would get
        (random ones for ``dedup=False``), writing nothing: InvalidInput for a bad spec."""
        return [row[0] for row in self._rows(specs, task, priority, dedup)]

    def _rows(self, specs: Iterable[str | Mapping[str, Any]], task: str | None, priority: int,
              dedup: bool, mode: str | None = None) -> list[Row]:
        """Rows with host keys made under ``mode`` (default: the namespace's key mode as this process
        last read it, else ``host``: no Redis read here, since :meth:`task_ids` must work while Redis
        is away; enqueue and the replay check or read the mode themselves)."""
        mode = mode or self._key_mode or "host"
        # The caller's trace context goes with the tasks (one look-up per call; None without tracing).
        return build_rows(specs, RowDefaults(
            task or self.default_task, priority, dedup, self.max_attempts, self.max_stalls, self.meta_cap,
            self.shard_count, self.host_gate, capture(), mode, self.url_rules))

    def _carried(self, rows: list[Row], window: int) -> set[int]:
        """Rows that an ancestor of a migration finished within ``window`` (``state/carried.py``):
        duplicates the enqueue script cannot see. Nothing to look up for most namespaces (the
        ancestors are read with the URL rules, in that once-per-queue round trip)."""
        if not self._carries:  # none, or not read: only a dedup row's rule check reads them
            return set()
        found = carried_duplicates(self.client, self.shard_keys(), self._carries, rows, window)
        if found:  # duplicates as the script counts its own, in the stats of each row's shard
            count_duplicates(self.client, self.shard_keys(), [rows[i][0] for i in found])
        return found

    def carried_finished(self, rows: list[Row]) -> list[int | None]:
        """When an ancestor of a migration finished each dedup row's URL (ms, the start of its hour;
        ``state/carried.py``), None where none did: sitemap ingestion compares it with ``lastmod``."""
        self._check_rules_once(rows)
        if not self._carries:
            return [None] * len(rows)
        return carried_times(self.client, self.shard_keys(), self._carries, rows)[1]

    def _check_rules_once(self, rows: list[Row]) -> None:
        """Before the first write: check the URL rules against the namespace's (for dedup rows), and
        read with them the ancestors whose remembered URLs it carries (state/carried.py) and where a
        migration moved the namespace to; those again once CARRY_TTL has passed (a migration that
        ended after this queue's first read, or a dedup sweep that forgot every carried id, is seen
        within that time). A namespace migrated away refuses every enqueue: it is paused for good,
        and what went in would never run."""
        if self._moved_to:
            self._refuse_moved()
        fresh = time.monotonic() - self._carries_at <= CARRY_TTL
        if self._rules_checked and fresh:
            return  # the common case, decided before looking at the rows
        if not self._rules_checked and any(row[2] == "1" for row in rows):
            self._keep_lineage(*check_rules_reading(self.client, self.namespace, self.url_rules, LINEAGE))
            self._rules_checked = True
        elif not fresh:
            self._keep_lineage(*self.client.hmget(self.keys.meta, LINEAGE))
        if self._moved_to:
            self._refuse_moved()

    def _refuse_moved(self) -> None:
        raise ConfigurationError(
            f"namespace {self.namespace!r} was migrated to {self._moved_to!r} (celery-ha migrate): "
            f"enqueue there (CELERY_HA_NAMESPACE={self._moved_to} with its CELERY_HA_SHARDS); this one "
            f"is paused for good and kept only until you purge it")

    def _keep_lineage(self, carry: str | None, ancestors: str | None, moved_to: str | None = None) -> None:
        """Keep the lineage fields as read (meta ``carry``, ``ancestors`` and ``migrated_to``), and when."""
        self._carries, self._ancestors = parse_carries(carry), parse_carries(ancestors)
        self._moved_to = moved_to.decode() if isinstance(moved_to, bytes) else moved_to
        self._carries_at = time.monotonic()

    def ancestors(self, rows: list[Row]) -> list[Carry]:
        """Every ancestor of a migration whose dedup ids meant something else (state/carried.py), as
        read with the URL rules (again after CARRY_TTL): meta ``ancestors``, and ``carry`` for
        namespaces migrated before ``ancestors`` was kept. Read only when ``rows`` hold a dedup row."""
        self._check_rules_once(rows)
        return list(dict.fromkeys([*(self._ancestors or []), *(self._carries or [])]))

    def _register_once(self) -> None:
        """Put the namespace in the registry of namespaces (``state/namespaces.py``) at this queue's
        first enqueue, so workers of a pattern find it: one ``SADD`` per queue object."""
        if not self._registered:
            register(self.client, self.namespace)
            self._registered = True

    def set_url_rules(self, rules: UrlRules) -> None:
        """Record ``rules`` as the namespace's URL canonicalisation and use them (``state/url_rules.py``)."""
        self.url_rules, self._rules_checked = set_rules(self.client, self.namespace, rules), True
        self._keep_lineage(*self.client.hmget(self.keys.meta, LINEAGE))  # read with the rules otherwise

    def enqueue_many_with_status(self, specs: Iterable[str | Mapping[str, Any]], *,
                                 task: str | None = None, priority: int = 0, dedup: bool = True,
                                 batch_size: int = SCRIPT_BATCH, recrawl_after: float | str | None = None
                                 ) -> list[tuple[str, bool]]:
        """Like :meth:`enqueue_many`, with each id paired with True when this call created the task
        (or started a new run of one finished ``recrawl_after`` ago) and False when it was a duplicate
        (decided atomically by the server, not by a pre-check; only the remembered URLs a migration
        carried, ``state/carried.py``, are looked up before). Task names are not checked against the
        live workers (the callers of this, ``celery-ha enqueue`` and sitemap ingestion, do)."""
        return self._enqueue(specs, task, priority, dedup, batch_size, recrawl_after, check_names=False)

    def _check_task_names(self, rows: list[Row]) -> None:
        """Refuse rows naming a task the live workers do not run as durable (module docstring)."""
        names = {row[3] for row in rows} - {self.default_task}  # the configured default costs no read
        if not names or _unchecked.get():
            return
        now = time.monotonic()
        known = self._known_tasks
        if now - self._known_tasks_at > KNOWN_TASKS_TTL or (known is not None and not names <= known):
            known = self._known_tasks = known_task_names(self.client, self.namespace, self.lease_ttl)
            self._known_tasks_at = now
        missing = sorted(names - known) if known is not None else []
        if missing:
            raise InvalidInput(
                f"task {missing[0]!r}: the live workers of namespace {self.namespace!r} run no @durable_task "
                f"of that name (they run {', '.join(sorted(known or ())) or 'none'}); a plain Celery "
                "task cannot be queued (decorate a function of ctx with @durable_task), and "
                "allow_unknown_task=True queues a name they do not run yet (a deployment on its way)")

    def _enqueue(self, specs: Iterable[str | Mapping[str, Any]], task: str | None, priority: int,
                 dedup: bool, batch_size: int, recrawl_after: float | str | None, check_names: bool
                 ) -> list[tuple[str, bool]]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise InvalidInput(f"batch_size must be an integer, got {shown(batch_size)}")
        batch_size = max(1, min(batch_size, MAX_BATCH))
        window = expiry_ms(self.dedup_ttl if recrawl_after is None else recrawl_after, "recrawl_after")
        # The key mode as last read, or 'host' before any read: enqueue.lua refuses keys made under a
        # mode no longer in force (only while the gate is on, when they matter), so no read is paid.
        mode = self._key_mode or "host"
        rows = self._rows(specs, task, priority, dedup, mode)
        if check_names:
            self._check_task_names(rows)
        self._check_rules_once(rows)
        if rows:
            self._register_once()
            if self._carries and self.hosts.mode() != mode:  # the carried look-up needs today's keys
                mode = self.hosts.mode()
                rekey(rows, mode, self.host_gate, self.shard_count)
        created: dict[int, bool] = dict.fromkeys(self._carried(rows, window), False)
        mode_changes = 0
        for start in range(0, len(rows), batch_size):
            pending = [i for i in range(start, min(start + batch_size, len(rows))) if i not in created]
            while pending:  # one round trip per shard the batch touches
                again: list[int] = []  # rows to send again: a random id that met an existing one
                for shard, at in by_shard([rows[i][0] for i in pending], self.shard_count).items():
                    part = [pending[a] for a in at]
                    codes = self._run("enqueue", window, mode, *grouped([rows[i] for i in part]), shard=shard)
                    if isinstance(codes, bytes):
                        codes = codes.decode()
                    if codes.startswith("!"):
                        # The namespace's host key mode changed since this process read it: nothing
                        # of this part was written. Every row of the batch not written yet, and every
                        # later batch, is keyed again (a gated row of a sharded namespace may move to
                        # another shard), and the batch is sent again from its new shards.
                        mode_changes += 1
                        if mode_changes > 10:
                            raise InvalidInput(f"the host key mode of namespace {self.namespace} keeps "
                                               f"changing (now {codes[1:]!r}); enqueue again")
                        mode = self._key_mode = codes[1:]
                        self._key_mode_at = time.monotonic()
                        unsent = [i for i in pending if i not in created]
                        rekey([rows[i] for i in unsent] + rows[start + batch_size:], mode, self.host_gate,
                              self.shard_count)
                        if self._carries:  # looked up again under the new keys
                            later = range(start + batch_size, len(rows))
                            recheck = unsent + [i for i in later if i not in created]
                            for p in self._carried([rows[i] for i in recheck], window):
                                created[recheck[p]] = False
                        pending = [i for i in unsent if i not in again and i not in created]
                        break
                    # One char per task: '1' new, '0' duplicate, '-' a random id met an existing one
                    # (astronomically rare): retried with a new id.
                    for i, code in zip(part, codes, strict=True):
                        if code == "-":
                            again.append(i)
                        else:
                            created[i] = code == "1"
                else:
                    pending = []
                for i in again:
                    rows[i][0] = random_id()
                    if self.host_gate and self.shard_count > 1 and rows[i][7]:
                        rows[i][0] = on_host_shard(rows[i][0], rows[i][7], False, "", "", self.shard_count)
                pending = pending + again
        return [(row[0], created[i]) for i, row in enumerate(rows)]

