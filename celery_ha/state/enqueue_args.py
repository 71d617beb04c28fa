"""Enqueue rows: validate task specs and pack them into the ARGV of ``enqueue.lua``.

Every spec of a call is checked before anything is sent, so a bad one anywhere writes nothing. The
payload JSON is assembled here, once per task, and fields shared by a run of tasks travel once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import (
    PRIORITY_RANGE,
    canonical_url,
    check_int,
    check_task_name,
    check_url,
    dumps_capped,
    iter_many,
    simple_canonical_url,
)
from celery_ha.state.ids import dedup_id, random_id

#: Most tasks sent in one script call: bounds how long one enqueue keeps Redis busy.
MAX_BATCH = 10_000

#: The keys a dict spec may carry: the keyword arguments of ``TaskQueue.enqueue``.
SPEC_FIELDS = frozenset({"url", "task", "priority", "meta", "dedup", "max_attempts", "max_stalls"})

#: One task as enqueue.lua takes it: [id, priority, dedup '1'/'0', task, max_attempts, max_stalls,
#: payload JSON]. A list, because a random id that collides is replaced in place and sent again.
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
            spec.get("max_attempts"), spec.get("max_stalls"), defaults))
    return rows


def build_row(url: str, task: str, priority: int, meta: Mapping[str, Any] | None, dedup: bool,
              max_attempts: int | None, max_stalls: int | None, defaults: RowDefaults) -> Row:
    """Validate one task and return its row; on every enqueued task's path, so the payload is
    assembled as text rather than through ``json.dumps`` of a dict."""
    simple = simple_canonical_url(url)
    if simple is not None:
        canonical = simple
    elif dedup:
        canonical = canonical_url(url)  # checks the URL as check_url does, parsing it once
    else:
        canonical = check_url(url)  # checked only: no dedup id needs the canonical form
    check_task_name(task)
    check_int("priority", priority, *PRIORITY_RANGE)
    ma = defaults.max_attempts if max_attempts is None else check_int("max_attempts", max_attempts, 1, 1000)
    ms = defaults.max_stalls if max_stalls is None else check_int("max_stalls", max_stalls, 0, 1000)
    # The payload is the compact JSON {"u": url[, "m": meta]}, assembled from its parts (the same
    # text json.dumps gives for that dict): a simple URL needs no escaping, meta is encoded once.
    url_json = f'"{url}"' if simple is not None else json.dumps(url, ensure_ascii=False)
    body = f'{{"u":{url_json}}}'
    if meta is not None:
        meta_json = dumps_capped("meta", meta, defaults.meta_cap)
        if meta:
            body = f'{{"u":{url_json},"m":{meta_json}}}'
    tid = dedup_id(task, canonical) if dedup else random_id()
    return [tid, priority, "1" if dedup else "0", task, ma, ms, body]


def grouped(rows: list[Row]) -> list[Any]:
    """ARGV of enqueue.lua (after the prefix): runs of consecutive rows sharing (priority, dedup,
    task, max_attempts, max_stalls) become one header ``count, priority, dedup, task, max_attempts,
    max_stalls`` followed by ``id, payload`` per row, so the common fields travel (and are encoded by
    Lua) once per run."""
    args: list[Any] = []
    current = None
    at = 0
    for tid, priority, dedup, task, ma, ms, body in rows:
        head = (priority, dedup, task, ma, ms)
        if head != current:
            current = head
            at = len(args)
            args += [0, priority, dedup, task, ma, ms]
        args[at] += 1
        args += (tid, body)
    return args
