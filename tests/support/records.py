"""Test access to task records wherever ``_records.lua`` keeps them (buckets ``t:<i>`` or the hash of
earlier releases): reads through the library's own reader, writes through the same Lua functions the
scripts use, so a test that edits a record by hand edits it where the scripts will look."""

from __future__ import annotations

from pathlib import Path

import redis

import celery_ha.state
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import all_records, read_record, record_count

__all__ = ["all_records", "delete_record", "drop_records", "has_record", "put_raw_record", "raw_record",
           "record_count"]

_STATE = Path(celery_ha.state.__file__).parent
_RECORDS_LUA = "".join((_STATE / f"{name}.lua").read_text(encoding="utf-8")
                       for name in ("_base62", "_records"))  # the includes, as _common orders them
_WRITE = ("local K_TASKS, PREFIX = KEYS[1], ARGV[1]\n" + _RECORDS_LUA
          + "\nif ARGV[3] == '' then rec_del({ARGV[2]}) else rec_set(ARGV[2], ARGV[3]) end\nreturn 1\n")


def raw_record(r: redis.Redis, keys: QueueKeys, task_id: str) -> str | None:
    """The stored record of ``task_id`` ("<state head>\\n<payload>"; ``decode_head`` of
    celery_ha/state/records.py reads the head), None when there is none."""
    return read_record(r, keys, task_id)


def has_record(r: redis.Redis, keys: QueueKeys, task_id: str) -> bool:
    return read_record(r, keys, task_id) is not None


def put_raw_record(r: redis.Redis, keys: QueueKeys, task_id: str, raw: str) -> None:
    """Write ``raw`` as the record of ``task_id`` (as a script would)."""
    r.eval(_WRITE, 1, keys.tasks, keys.prefix, task_id, raw)


def delete_record(r: redis.Redis, keys: QueueKeys, task_id: str) -> None:
    """Delete the record of ``task_id`` (as the history's trim would)."""
    r.eval(_WRITE, 1, keys.tasks, keys.prefix, task_id, "")


def drop_records(r: redis.Redis, keys: QueueKeys) -> None:
    """Delete every record of the shard and the bucket geometry (as a lost dataset would)."""
    doomed = [keys.tasks, keys.record_geometry, *r.scan_iter(match=keys.prefix + "t:*", count=1000)]
    r.delete(*doomed)
