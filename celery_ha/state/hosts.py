"""The host gate: per-host politeness and fairness kept in the queue, not in the workers.

Design (the Lua side is ``_hosts.lua``, included by every task-state script through ``_common``):

* **A host key per task.** By default the URL's host plus a non-default port, the same key the proxy
  pool counts its per-domain windows under (``base/hosts.py``); ``host=`` at enqueue overrides it
  (another host name, or a custom key: a registered domain, a site id), ``host=""`` opts out.
* **The gate is per namespace** and off until switched on: by ``CELERY_HA_HOSTS=1`` or a host default
  (``CELERY_HA_HOST_RATE`` / ``_DELAY`` / ``_CONCURRENCY``) in a process that writes to the namespace,
  or by any host setting or block (``HostGate.set`` / ``block`` ...). It is recorded in Redis
  (``hcfg`` field ``on``). What the fetcher reports (``request``, ``finished``, ``defer``,
  ``block_until_retry``, ``backoff``, ``set_crawl_delay``) switches on only a namespace never
  switched: its task may be one still draining after an operator's ``switch(False)``. While it is
  off a task records no host and goes to its priority band, exactly as without a gate (the scripts
  pay one nil check, and dispatch/claim one EXISTS per call).
  While it is on, a new task with a host key records it (``"h"`` in the record's state part) and
  waits in its host's queue (a list per band, ``hl:<band>:<host>``); tasks queued before the gate was
  on stay in their bands.
* **Per host** (``h:<host>``): limits — a rate ``N/S`` (kept as the spacing ``S/N`` between two
  hand-outs, so no window of ``S`` seconds ever holds more than ``N``), a delay, a concurrency and a
  budget, each an override of the namespace default (``hcfg``), plus the robots.txt Crawl-delay —
  and state: tasks active (dispatched + running) and dispatched (unclaimed), hand-outs used against
  the budget, next eligible time and blocked-until (Redis clock), backoff level, block reason, done
  and dead counters. The queued count is the size of its queue (stale entries included until a pop
  skips them).
* **Eligible now** = not blocked, past its next eligible time, under its concurrency and budget,
  and, when paced (a spacing > 0), no message of it still unclaimed: its next hand-out is timed from
  the claim, so the starts a site sees are spaced by at least the spacing however long a message
  waited in the broker. Hosts with queued tasks sit in one of two sorted sets: ``hready`` (eligible,
  ordered by the priority of their best task, then least recently served) or ``hwait`` (by the time
  they become eligible, or after all times when an event must come first: a freed slot, a claim,
  more budget; each such event files the host again).
* **Dispatch and claim_next** pop the best of the ready bands (ungated tasks) and ``hready``'s first
  host (``pop_best`` in ``_common.lua``): the higher priority first, on a tie they take turns. A
  popped host hands out its best task (LPOP of its best band's list), its next eligible time moves one
  spacing on, and it is filed again: back in ``hready`` behind every equal host (round robin), or in
  ``hwait``. Each hand-out costs O(log hosts + log tasks of the host); ``hwait``'s due hosts move to
  ``hready`` in bounded batches. A host that is not eligible keeps its tasks queued: they cost no
  message and no worker slot.
* **Every path that ends a slot** gives it back in the same script: complete (and complete-and-
  dispatch / -claim), fail, release (fast failover, graceful hand-back), reclaim, cancel. Redrive,
  recrawl, promotion of due retries and stalls queue a gated task in its host's queue again.
* **Sharding:** a sharded namespace with the gate on places a task on its host's shard (the task id
  is chosen so: ``enqueue_args.on_host_shard``), so one host's queue and state live in one slot, and
  every script names the host keys from its shard's prefix (one hash tag).

This module is the Python face: limits, blocks, listing. ``TaskQueue.hosts`` returns one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import check_host_key, check_key_mode, host_of_url, mode_key
from celery_ha.base.validation import MAX_ERROR_CHARS, check_int, check_number, clean_message, parse_rate
from celery_ha.state.host_queues import host_states_and_lengths
from celery_ha.state.lease_gate import LeaseGate
from celery_ha.state.records import Lease
from celery_ha.state.replies import raise_for
from celery_ha.state.shards import shard_of

#: Marks an argument of :meth:`HostGate.set` left out (None clears an override instead).
UNSET: Any = object()
SLOT = 9e15  # hwait's score of a host that waits for an event (as SLOT in _hosts.lua)
MAX_SECONDS = 30 * 86400.0
SORTS = ("queued", "running", "done", "dead", "host", "next", "blocked")
#: Seconds a process trusts the key mode it read, outside enqueue (which the script checks).
MODE_TTL = 2.0


@dataclass(frozen=True)
class HostInfo:
    """A snapshot of one host of the gate. Times are seconds since the epoch (Redis clock)."""

    host: str
    queued: int
    dispatched: int  # sent to the broker, not yet claimed
    running: int
    done: int  # completed tasks (since the host was first seen)
    dead: int  # tasks that died
    rate: str | None  # "N/S" (its own, else the default), None = no rate
    delay: float  # seconds between two hand-outs (its own, else the default)
    crawl_delay: float  # robots.txt Crawl-delay in force (seconds, capped), 0 = none
    concurrency: int  # 0 = no limit
    budget: int | None  # hand-outs allowed in all, None = no budget
    budget_left: int | None
    next_eligible: float | None  # when the host may hand out its next task (None = now, or no task)
    blocked_until: float | None
    block_reason: str | None
    backoff_level: int
    state: str  # 'idle' (nothing queued), 'ready', 'waiting' (pacing), 'blocked', 'full' (slot/budget)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms(seconds: float) -> str:
    return str(round(seconds * 1000))


def _rate_fields(rate: object) -> list[str]:
    """``rate`` as host_limits.lua takes it: the spacing in ms and the text shown."""
    if rate is None:
        return ["iv", "", "rate", ""]
    n, per = parse_rate(rate, "rate")
    if per / n > MAX_SECONDS:
        raise InvalidInput(f"rate {n}/{per:g} is slower than one task per {MAX_SECONDS:g} s")
    return ["iv", _ms(per / n), "rate", f"{n}/{per:g}"]


class HostGate:
    """Limits, blocks and listings of the hosts of one namespace (see the module docstring)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue  # the TaskQueue (untyped here: taskqueue.py imports this module)

    def _shard(self, host: str) -> int:
        return shard_of(host, self.queue.shard_count)

    def _limits(self, host: str, rate: object, delay: object, concurrency: object, budget: object,
                crawl_delay: object = UNSET) -> list[str]:
        args: list[str] = []
        if rate is not UNSET:
            args += _rate_fields(rate)
        if delay is not UNSET:
            args += ["dl", "" if delay is None else _ms(
                check_number("delay", delay, 0, MAX_SECONDS, "seconds"))]
        if concurrency is not UNSET:
            args += ["cc", "" if concurrency is None else str(
                check_int("concurrency", concurrency, 0, 1_000_000))]
        if budget is not UNSET:
            args += ["bg", "" if budget is None else str(check_int("budget", budget, 0, 10**12))]
        if crawl_delay is not UNSET:
            args += ["cd", "" if crawl_delay is None else _ms(
                check_number("crawl_delay", crawl_delay, 0, MAX_SECONDS, "seconds"))]
        return args

    def set(self, host: str, *, rate: object = UNSET, delay: object = UNSET, concurrency: object = UNSET,
            budget: object = UNSET) -> None:
        """Override the host's limits: ``rate`` "N/S" or (N, S), ``delay`` seconds between two of its
        tasks, ``concurrency`` tasks at once (0 = no limit), ``budget`` tasks handed out in all (counted
        from the host's first task; raise it to go on). None drops an override (the namespace default
        applies again); a left-out argument is unchanged. Switches the namespace's gate on."""
        key = check_host_key(host)
        args = self._limits(key, rate, delay, concurrency, budget)
        self.queue._run("host_limits", key, *args, shard=self._shard(key))

    # ------------------------------------------------------------------ key mode
    def mode(self, fresh: bool = False) -> str:
        """The namespace's host key mode (``base/hosts.py`` KEY_MODES; ``host`` until one is set), as
        read at most :data:`MODE_TTL` seconds ago unless ``fresh``."""
        queue = self.queue
        if fresh or queue._key_mode is None or time.monotonic() - queue._key_mode_at > MODE_TTL:
            queue._key_mode = self.queue.client.hget(self.queue._shards[0].prefix + "hcfg", "km") or "host"
            queue._key_mode_at = time.monotonic()
        return queue._key_mode

    def set_mode(self, mode: str) -> str:
        """Set how a task that gives no ``host=`` gets its host key, for every process of the namespace:
        ``host`` (the URL's host, the default), ``registered-domain`` (``a.example.co.uk`` and
        ``b.example.co.uk`` share the gate ``example.co.uk``; public suffix list snapshot bundled
        with tldextract) or ``custom`` (only tasks given ``host=`` are gated). Tasks queued before
        keep their keys. Switches the gate on. Returns the mode set."""
        mode = check_key_mode(mode)
        for shard in range(self.queue.shard_count):
            self.queue._run("host_limits", "", "km", mode, shard=shard)
        self.queue._key_mode, self.queue._key_mode_at = mode, time.monotonic()
        return mode

    def switch(self, on: bool) -> None:
        """Switch the namespace's gate on or off (every shard). Off: a new task records no host and
        goes to its priority band, exactly as without a gate; tasks already in host queues still go
        out under their hosts' limits until they are drained (the fetcher's reports of those do not
        switch it on again). A process started with ``CELERY_HA_HOSTS=1`` or a host default
        switches it on again at its first call."""
        for shard in range(self.queue.shard_count):
            self.queue._run("host_limits", "", "on", "1" if on else "0", shard=shard)

    def key(self, host: str) -> str:
        """The gate key a host name given by a caller stands for under the namespace's key mode: in
        ``registered-domain`` mode its registered domain (blocking ``a.example.com`` holds back
        ``example.com``, the gate its tasks wait under), else the host key itself. A custom key
        (not a host name) is itself in every mode."""
        key = check_host_key(host)
        return mode_key(key, "registered-domain") if self.mode() == "registered-domain" else key

    def key_of_url(self, url: str) -> str:
        """The gate key a task of ``url`` that gives no ``host=`` gets now ('' = none)."""
        try:
            return mode_key(host_of_url(url), self.mode())
        except InvalidInput:
            return ""

    def set_defaults(self, *, rate: object = UNSET, delay: object = UNSET, concurrency: object = UNSET,
                     budget: object = UNSET) -> None:
        """The limits of every host without an override of its own (None = no such default). Switches
        the namespace's gate on (on every shard).

        New limits may free a host that waits for an event that will not come (parked for its
        budget or concurrency), so every host is filed again: one bounded script call per ~1,000
        hosts (``rf``, the cursor kept in Redis), called until none is left; should this process
        die halfway, the next dispatches and claims go on with it."""
        args = self._limits("", rate, delay, concurrency, budget)
        for shard in range(self.queue.shard_count):
            more = self.queue._run("host_limits", "", *args, shard=shard)
            while more:
                more = self.queue._run("host_limits", "", "rf", "1", shard=shard)

    def set_crawl_delay(self, host: str, seconds: float | None, cap: float = 30.0) -> float:
        """Store a robots.txt ``Crawl-delay`` with the host, capped at ``cap`` seconds (None or 0 drops
        it): every worker then spaces the host's tasks by at least that much. Returns the delay kept."""
        key = self.key(host)
        cap = check_number("cap", cap, 0, MAX_SECONDS, "seconds")
        kept = 0.0 if not seconds else min(
            check_number("crawl_delay", seconds, 0, MAX_SECONDS, "seconds"), cap)
        # "on" "": learnt by the fetcher, maybe for a task still draining after `hosts off`: switches
        # on only a namespace never switched (host_limits.lua), never one switched off.
        self.queue._run("host_limits", key, *self._limits(key, UNSET, UNSET, UNSET, UNSET, kept or None),
                        "on", "", shard=self._shard(key))
        return kept

    def _block(self, host: str, op: str, ms: str = "0", reason: str = "", *extra: str) -> float | None:
        key = self.key(host)
        until = int(self.queue._run("host_block", key, op, ms, clean_message(reason, MAX_ERROR_CHARS), *extra,
                                    shard=self._shard(key)))
        return until / 1000.0 if until else None

    def block(self, host: str, seconds: float, reason: str = "blocked by the operator") -> float | None:
        """Hand out none of the host's tasks for ``seconds`` (replaces an earlier block; running tasks
        are left alone). Returns the blocked-until time."""
        return self._block(host, "block", _ms(check_number("seconds", seconds, 0, MAX_SECONDS, "seconds")),
                           reason)

    def block_until_retry(self, host: str, seconds: float, reason: str) -> float | None:
        """A ``Retry-After``: block the host for ``seconds`` unless it is blocked longer already."""
        return self._block(host, "extend", _ms(check_number("seconds", seconds, 0, MAX_SECONDS, "seconds")),
                           reason)

    def backoff(self, host: str, reason: str, *, start: float = 60.0, cap: float = 86400.0,
                forgive: float = 1800.0, jitter: float = 0.1) -> float | None:
        """A 429/503 without ``Retry-After``: block the host for ``start`` x 2^level seconds (capped at
        ``cap``, scaled by a jitter of +/- ``jitter``), the level growing with each backoff and
        forgiven after ``forgive`` quiet seconds. Returns the blocked-until time."""
        return self._block(
            host, "backoff", _ms(check_number("start", start, 0.001, MAX_SECONDS, "seconds")), reason,
            _ms(check_number("cap", cap, 0.001, MAX_SECONDS, "seconds")),
            _ms(check_number("forgive", forgive, 0, MAX_SECONDS, "seconds")),
            str(check_number("jitter", jitter, 0, 0.9)))

    def unblock(self, host: str) -> None:
        """Lift the host's block and reset its backoff level."""
        self._block(host, "unblock")

    def fences(self, lease: Lease) -> bool:
        """Whether asks for the task's own host check ``lease`` (a gated task is on its host's shard)."""
        return bool(lease.task.host) and self._task_args(lease.task.host, lease)[0] != ""

    def _task_args(self, key: str, lease: Lease | None) -> list[str]:
        """The task id and token an op of host ``key`` names, if the task is on the host's shard."""
        if lease is None or self.queue._of(lease.task_id) != self._shard(key):
            return ["", ""]
        return [lease.task_id, str(lease.token)]

    def request(self, host: str, lease: Lease | None = None, in_flight: float = 0.0) -> float:
        """A request to the host asks to go out now: 0.0 when it may (stamped: the host's spacing
        counts from here), else the seconds to wait (its block, or its spacing from the last
        request's start or answer), nothing written. The fetcher asks before every request of a task
        on its own host, so the gap a site sees is at least the spacing, whatever a task did since its
        claim (a slow robots.txt, a retry, its second page) and whichever worker sends the other.
        With the task's ``lease`` (if :meth:`fences` it) the ask is fenced: LeaseLost when the task
        is no longer the lease's, so a woken zombie sends nothing. ``in_flight``: the seconds the
        request may be in flight at most; under a concurrency limit it is marked in flight until then
        (or :meth:`finished`): a holder dying first leaves its slot held."""
        key = self.key(host)
        task = self._task_args(key, lease)
        bound = _ms(in_flight) if task[0] and in_flight > 0 else ""
        reply = int(self.queue._run("host_block", key, "request", "0", *task, bound, shard=self._shard(key)))
        if reply < 0:
            raise_for(reply, lease.task_id, lease.token)  # type: ignore[union-attr]
        return reply / 1000.0

    def for_lease(self, lease: Lease, in_flight: float = 0.0) -> LeaseGate:
        """This gate as one fetch of the task under ``lease`` uses it (see :class:`LeaseGate`)."""
        return LeaseGate(self, lease, in_flight)

    def finished(self, host: str, lease: Lease | None = None) -> None:
        """A request to the host got its answer (or failed) now: its spacing counts from here too (the
        site saw it somewhere between :meth:`request` and this: only the later stamp guarantees the
        gap; the price is one round trip per request). With its ``lease``, its in-flight mark goes."""
        k = self.key(host)
        self.queue._run("host_block", k, "start", "0", *self._task_args(k, lease), shard=self._shard(k))

    def unsent(self, host: str, lease: Lease) -> None:
        """The request let go for the task under ``lease`` never went out: its mark goes, unstamped."""
        k = self.key(host)
        self.queue._run("host_block", k, "unsent", "0", *self._task_args(k, lease), shard=self._shard(k))

    def defer(self, host: str, seconds: float) -> None:
        """Hand out none of the host's tasks for ``seconds`` (its next eligible time moves there, never
        back): a refusal at fetch time, with its retry time."""
        self._block(host, "defer", _ms(check_number("seconds", seconds, 0, MAX_SECONDS, "seconds")))

    # ------------------------------------------------------------------ reads
    def _defaults(self, shard: int) -> dict[str, str]:
        return self.queue.client.hgetall(self.queue._shards[shard].prefix + "hcfg")

    def enabled(self) -> bool:
        """Whether the namespace's gate is on (new tasks with a host are queued per host)."""
        return self._defaults(0).get("on") == "1"

    def hosts(self) -> list[str]:
        """Every host the gate knows (queued a task, or got a setting)."""
        out: list[str] = []
        for keys in self.queue._shards:
            out += sorted(self.queue.client.sscan_iter(keys.prefix + "hosts", count=1000))
        return out

    def get(self, host: str) -> HostInfo:
        """The snapshot of one host (an unknown host shows its defaults and zero counts)."""
        key = self.key(host)
        return self._infos([key])[0]

    def list(self, sort: str = "queued", limit: int | None = None) -> list[HostInfo]:
        """Every host's snapshot, sorted by ``sort`` (one of :data:`SORTS`; counts and times
        descending, ``host`` ascending), at most ``limit``."""
        if sort not in SORTS:
            raise InvalidInput(f"sort must be one of {', '.join(SORTS)}, got {sort!r}"[:200])
        infos = self._infos(self.hosts())
        keys = {
            "queued": lambda i: (-i.queued, i.host), "running": lambda i: (-i.running, i.host),
            "done": lambda i: (-i.done, i.host), "dead": lambda i: (-i.dead, i.host),
            "host": lambda i: (i.host,), "next": lambda i: (-(i.next_eligible or 0), i.host),
            "blocked": lambda i: (-(i.blocked_until or 0), i.host),
        }
        infos.sort(key=keys[sort])
        return infos if limit is None else infos[:check_int("limit", limit, 0, 10**9)]

    def waiting(self) -> dict[str, int]:
        """Queued tasks of gated hosts by why they wait: ``blocked`` (host blocked), ``not_eligible``
        (paced, at its concurrency or budget) and ``eligible`` (their host may hand out now)."""
        out = {"blocked": 0, "not_eligible": 0, "eligible": 0}
        for info in self._infos(self.hosts()):
            if info.state == "blocked":
                out["blocked"] += info.queued
            elif info.state in ("waiting", "full"):
                out["not_eligible"] += info.queued
            else:
                out["eligible"] += info.queued
        return out

    def _infos(self, hosts: list[str]) -> list[HostInfo]:
        client = self.queue.client
        now_s, now_us = client.time()
        now = now_s * 1000 + now_us // 1000
        defaults = [self._defaults(s) for s in range(self.queue.shard_count)]
        out: list[HostInfo] = []
        for at in range(0, len(hosts), 500):
            chunk = hosts[at:at + 500]
            read: list[tuple[dict[str, str], int]] = [({}, 0)] * len(chunk)
            for shard in {self._shard(h) for h in chunk}:  # a host's state and queue share its shard
                at_shard = [j for j, h in enumerate(chunk) if self._shard(h) == shard]
                got = host_states_and_lengths(client, self.queue._shards[shard], [chunk[j] for j in at_shard])
                for j, pair in zip(at_shard, got, strict=True):
                    read[j] = pair
            for j, h in enumerate(chunk):
                out.append(_info(h, read[j][0], read[j][1], defaults[self._shard(h)], now))
        return out


def _num(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else 0.0
    except ValueError:
        return 0.0


def _pick(hs: dict[str, str], defaults: dict[str, str], field: str) -> str | None:
    value = hs.get(field)
    if value in (None, ""):
        value = defaults.get(field)
    return None if value in (None, "") else value


def _info(host: str, hs: dict[str, str], queued: int, defaults: dict[str, str], now: int) -> HostInfo:
    """A host's snapshot from its hash, its queue size and the namespace defaults (as _hosts.lua
    reads them: an override, else the default)."""
    active, dispatched, used = int(_num(hs.get("a"))), int(_num(hs.get("d"))), int(_num(hs.get("u")))
    rate_text = _pick(hs, defaults, "rate")
    iv, dl, cd = _num(_pick(hs, defaults, "iv")), _num(_pick(hs, defaults, "dl")), _num(hs.get("cd"))
    cc = int(_num(_pick(hs, defaults, "cc")))
    budget_raw = _pick(hs, defaults, "bg")
    budget = None if budget_raw is None or int(_num(budget_raw)) < 0 else int(_num(budget_raw))
    left = None if budget is None else max(0, budget - used)
    ne, bu = _num(hs.get("ne")), _num(hs.get("bu"))
    held = sum(1 for f, v in hs.items() if f.startswith("x:") and _num(v) > now)  # as host_due()
    spacing = max(iv, dl, cd)
    if spacing > 0 and hs.get("ls"):
        ne = max(ne, _num(hs.get("ls")) + spacing)  # as host_due() in _hosts.lua
    blocked = bu > now
    if queued == 0:
        state = "idle"
    elif blocked:
        state = "blocked"
    elif left == 0 or (cc > 0 and active + held >= cc) or (dispatched and spacing > 0):
        state = "full"
    elif ne > now:
        state = "waiting"
    else:
        state = "ready"
    return HostInfo(
        host=host, queued=queued, dispatched=dispatched, running=max(0, active - dispatched),
        done=int(_num(hs.get("done"))), dead=int(_num(hs.get("dead"))),
        rate=rate_text if iv > 0 else None, delay=dl / 1000.0, crawl_delay=cd / 1000.0, concurrency=cc,
        budget=budget, budget_left=left,
        next_eligible=ne / 1000.0 if ne > now else None, blocked_until=bu / 1000.0 if blocked else None,
        block_reason=(hs.get("br") or None) if blocked else None, backoff_level=int(_num(hs.get("bl"))),
        state=state)
