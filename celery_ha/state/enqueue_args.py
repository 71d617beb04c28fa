"""Enqueue rows: validate task specs and pack them into the ARGV of ``enqueue.lua``.

Every spec of a call is checked before anything is sent, so a bad one anywhere writes nothing. The
payload JSON is assembled here, once per task, and fields shared by a run of tasks travel once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import bare_host_key, check_host_key, host_of_url, mode_key, normalize_domain
from celery_ha.base.tracing import check_trace
from celery_ha.base.urls import DEFAULT_RULES, UrlRules, authority, canonical_url, simple_canonical_url
from celery_ha.base.validation import (
    PRIORITY_RANGE,
    check_int,
    check_task_name,
    check_url,
    dumps_capped,
    iter_many,
)
from celery_ha.state.ids import dedup_id, random_id
from celery_ha.state.shards import shard_of

#: Most tasks sent in one script call: bounds how long one enqueue keeps Redis busy.
MAX_BATCH = 10_000

#: The default rows per script call of enqueue, the outbox replay and reclaim, so that no call keeps
#: every other client (claims, renewals, heartbeats) waiting 10 ms: enqueueing 10M with 250 rows per
#: call averaged ~5 ms a call with 86 of 40,000 calls over 10 ms of Redis CPU, with 100 rows 1.7 ms
#: and at most 3.4 ms; with the host gate on, 100-row calls still went over 10 ms on slower VMs (up
#: to 143 of 100,000), 50-row calls none of 200,001, the longest 2.66 ms (benchmarks/RESULTS.md,
#: "Slow enqueue calls at 10M", "The gated enqueue at 10M in 50-row calls"). More round trips cost
#: little throughput: the per-row work dominates.
SCRIPT_BATCH = 50

#: The keys a dict spec may carry: the keyword arguments of ``TaskQueue.enqueue``.
SPEC_FIELDS = frozenset({"url", "task", "priority", "meta", "dedup", "max_attempts", "max_stalls", "host",
                         "trace"})

#: One task as enqueue.lua takes it: [id, priority, dedup '1'/'0', task, max_attempts, max_stalls,
#: payload (_record_codec.lua), host key ('' = none)], then what its host key is derived from
#: (:class:`KeySource`, not sent). A list, because a random id that collides, or a host key made under
#: a key mode that changed meanwhile, is replaced in place and sent again.
Row = list[Any]


class RowDefaults(NamedTuple):
    """What a spec that leaves a field out gets: the call's arguments, then the queue's settings
    (already validated, so they are not checked again per task)."""

    task: str
    priority: int
    dedup: bool
    max_attempts: int
    max_stalls: int
    meta_cap: int
    shards: int = 1  # the namespace's shard count
    by_host: bool = False  # a sharded namespace places a task on its host's shard (the host gate)
    #: The enqueuing code's trace context (``base/tracing.py``), stored with every task of the call
    #: that gives none of its own.
    trace: str | None = None
    #: The namespace's host key mode (``base/hosts.py`` KEY_MODES) the rows' host keys follow.
    key_mode: str = "host"
    #: The namespace's URL canonicalisation rules (``base/urls.py``): dedup ids are made under them.
    rules: UrlRules = DEFAULT_RULES


class KeySource(NamedTuple):
    """What a row's host key is made from, kept so it can be made again under another key mode."""

    url: str
    host: object  # the spec's ``host`` (None = the URL's)
    simple: bool
    canonical: str


def build_rows(specs: Iterable[str | Mapping[str, Any]], defaults: RowDefaults) -> list[Row]:
    """Validate every spec (a URL, or a dict of :data:`SPEC_FIELDS`) and return its row."""
    each = iter_many("tasks (URLs or dicts)", specs)
    rows: list[Row] = []
    for spec in each:
        if isinstance(spec, str):
            spec = {"url": spec}
        elif not isinstance(spec, Mapping):
            raise InvalidInput(f"each task must be a URL or a dict, got {type(spec).__name__}")
        unknown = spec.keys() - SPEC_FIELDS
        if unknown:
            names = sorted(k if isinstance(k, str) and k.isascii() and k.isprintable() else repr(k)
                           for k in unknown)
            raise InvalidInput(f"unknown task field(s): {', '.join(names)}")
        if "url" not in spec:
            raise InvalidInput("task spec has no 'url'")
        rows.append(build_row(
            spec["url"], spec.get("task") or defaults.task,
            defaults.priority if spec.get("priority") is None else spec["priority"], spec.get("meta"),
            defaults.dedup if spec.get("dedup") is None else bool(spec["dedup"]),
            spec.get("max_attempts"), spec.get("max_stalls"), defaults, spec.get("host"),
            defaults.trace if spec.get("trace") is None else check_trace(spec["trace"])))
    return rows


def row_host(url: str, host: object, simple: bool = False, canonical: str | None = None,
             mode: str = "host") -> str:
    """The host key of a task: ``host`` when given ('' = none: the task is never gated), else the
    URL's under the namespace's key ``mode`` (``base/hosts.py``: its host, its registered domain, or
    none for ``custom``; '' for a URL whose host is no host name, an IPv6 literal say).
    ``simple``: the URL has the simple shape (``simple_canonical_url``): its authority is a bare
    lower-case host, read without parsing the URL. ``canonical``: the URL's canonical form, already
    made for its dedup id: the host key is read from it instead of canonicalising the URL again."""
    if host is None and mode == "custom":
        return ""
    if host is None and simple:
        key = bare_host_key(url.split("/", 3)[2])
        return key if mode == "host" else mode_key(key, mode)
    if host is None:
        try:
            return mode_key(normalize_domain(authority(canonical)) if canonical else host_of_url(url), mode)
        except InvalidInput:
            return ""
    if host == "":
        return ""
    return check_host_key(host)


def on_host_shard(tid: str, host: str, dedup: bool, task: str, canonical: str, shards: int) -> str:
    """The id of a task placed on its host's shard: a host's queue and politeness state live on one
    shard (CRC-32 of the host key), so its tasks' ids must map there too. A dedup id takes the first
    of the digests of (task, canonical URL, n) for n = 0, 1, ... that does (n = 0: the plain id), so
    every process finds the same one; a random id is drawn again. About ``shards`` tries on average."""
    want = shard_of(host, shards)
    n = 0
    while shard_of(tid, shards) != want:
        n += 1
        tid = dedup_id(task, f"{canonical}\0{n}") if dedup else random_id()
    return tid


def build_row(url: str, task: str, priority: int, meta: Mapping[str, Any] | None, dedup: bool,
              max_attempts: int | None, max_stalls: int | None, defaults: RowDefaults,
              host: object = None, trace: str | None = None) -> Row:
    """Validate one task and return its row; on every enqueued task's path, so the payload is
    assembled as text rather than through ``json.dumps`` of a dict."""
    simple = simple_canonical_url(url)
    if simple is not None:
        canonical = simple
    elif dedup or host is None:  # the dedup id or the host key is made from the canonical form
        canonical = canonical_url(url, defaults.rules)  # checks the URL as check_url does
    else:
        canonical = check_url(url)  # checked only: neither needs the canonical form
    check_task_name(task)
    check_int("priority", priority, *PRIORITY_RANGE)
    ma = defaults.max_attempts if max_attempts is None else check_int("max_attempts", max_attempts, 1, 1000)
    ms = defaults.max_stalls if max_stalls is None else check_int("max_stalls", max_stalls, 0, 1000)
    # The payload is the compact JSON {"u": url[, "m": meta][, "t": trace]}, assembled from its parts
    # (the text json.dumps gives for that dict): a simple URL needs no escaping, meta is encoded once.
    # A URL alone that JSON would not escape is stored bare, 9 bytes less per task, and an https one
    # without its scheme, "//host/p", 6 bytes less (a JSON payload starts with '{', a payload
    # starting with '/' is an https URL, a checked URL starts with a letter: _record_codec.lua's header).
    meta_json = None if meta is None else dumps_capped("meta", meta, defaults.meta_cap)
    url_json = f'"{url}"' if simple is not None else json.dumps(url, ensure_ascii=False)
    if not meta and not trace and (simple is not None or url_json[1:-1] == url):
        body = url[6:] if url.startswith("https://") else url
    else:
        body = '{"u":' + url_json
        if meta:
            body += f',"m":{meta_json}'
        body += f',"t":{json.dumps(trace)}}}' if trace else "}"
    tid = dedup_id(task, canonical) if dedup else random_id()
    key = row_host(url, host, simple is not None, canonical if host is None and simple is None else None,
                   defaults.key_mode)
    if defaults.by_host and defaults.shards > 1 and key:
        tid = on_host_shard(tid, key, dedup, task, canonical, defaults.shards)
    return [tid, priority, "1" if dedup else "0", task, ma, ms, body, key,
            KeySource(url, host, simple is not None, canonical)]


def rekey(rows: list[Row], mode: str, by_host: bool, shards: int) -> None:
    """Make the rows' host keys again under key ``mode`` (the namespace's mode changed after they
    were built): a sharded namespace's gated row moves to its new key's shard (its id is chosen
    again as :func:`on_host_shard` chooses it), and a dedup row that no longer has a key gets its
    plain id back (as :func:`build_row` gives it under that mode)."""
    for row in rows:
        src: KeySource = row[8]
        row[7] = row_host(src.url, src.host, src.simple,
                          src.canonical if src.host is None and not src.simple else None, mode)
        dedup = row[2] == "1"
        placed = by_host and shards > 1 and bool(row[7])
        if dedup:
            row[0] = dedup_id(row[3], src.canonical)
        if placed:
            tid = row[0] if dedup else random_id()
            row[0] = on_host_shard(tid, row[7], dedup, row[3], src.canonical, shards)


def grouped(rows: list[Row]) -> list[Any]:
    """ARGV of enqueue.lua (after the prefix): runs of consecutive rows sharing (priority, dedup,
    task, max_attempts, max_stalls) become one header ``count, priority, dedup, task, max_attempts,
    max_stalls`` followed by ``id, payload, host`` per row, so the common fields travel (and are
    encoded by Lua) once per run."""
    args: list[Any] = []
    current = None
    at = 0
    for tid, priority, dedup, task, ma, ms, body, host, *_ in rows:
        head = (priority, dedup, task, ma, ms)
        if head != current:
            current = head
            at = len(args)
            args += [0, priority, dedup, task, ma, ms]
        args[at] += 1
        args += (tid, body, host)
    return args
