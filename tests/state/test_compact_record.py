"""The two savings of issue 30 item 2 on a real Redis, through the real scripts (``_record_codec.lua``'s
header): a bare https URL is stored without its scheme ("//host/p"), and a dedup task's state letter
is upper-case with its dd field left empty. Records of the earlier forms (a whole "https://" URL, a
head with dd "1" and a lower-case letter, a JSON head) are read right by Python and Lua and written
in the new form at their next write; http URLs and JSON payloads are left as they are."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.done_times import remembered
from celery_ha.state.listing import completed_matching, list_tasks
from celery_ha.state.metrics import read_queue_metrics
from celery_ha.state.records import HEAD_SEP, decode_head
from tests.support.cli import run
from tests.support.invariants import check_invariants
from tests.support.records import put_raw_record, raw_record

CT = "1796407325451"


def _split(r: redis.Redis, q: TaskQueue, tid: str) -> tuple[str, str]:
    head, _, body = raw_record(r, q.keys, tid).partition("\n")
    return head, body


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "cr", backoff_base=0.001, backoff_cap=0.002)


def test_the_new_forms_go_through_a_lifecycle(r: redis.Redis, q: TaskQueue, redis_url: str) -> None:
    url = "https://example.com/catalog/items/0000000001?ref=list"
    tid = q.enqueue(url)
    head, body = _split(r, q, tid)
    assert body == "//example.com/catalog/items/0000000001?ref=list"
    assert head.split(HEAD_SEP)[0] == "Q" and len(head.split(HEAD_SEP)) == 2, head  # s, ct: no dd
    assert decode_head(head)["s"] == "q" and decode_head(head)["dd"] == "1"
    info = q.get(tid)
    assert (info.url, info.state, info.dedup) == (url, "queued", True)
    assert read_queue_metrics(r, "cr").oldest_ready_ms is not None  # the queued head is read as queued
    lease = q.claim_next("w:1")
    assert lease is not None and lease.task_id == tid and lease.url == url and lease.task.dedup
    head, body = _split(r, q, tid)
    assert head[:1] == "R" and head.split(HEAD_SEP)[2] == "" and body.startswith("//example.com/")
    assert q.fail(lease, "boom", retry=True) == "retry"
    assert _split(r, q, tid)[0][:1] == "W" and q.get(tid).state == "delayed"
    lease = None
    for _ in range(200):  # the retry is due within 2 ms; claim_next promotes it
        lease = q.claim_next("w:2")
        if lease is not None:
            break
    assert lease is not None and lease.task_id == tid and lease.url == url and lease.task.attempts == 1
    q.complete(lease)
    head, body = _split(r, q, tid)
    assert head[:1] == "C" and body == "//example.com/catalog/items/0000000001?ref=list"
    info = q.get(tid)
    assert (info.url, info.state, info.dedup, info.attempts) == (url, "completed", True, 1)
    assert remembered(r, q.keys, tid)  # complete_task saw st.dd
    assert [i.url for i in list_tasks(q, "completed")] == [url]
    assert completed_matching(q, match="https://example.com/catalog/*") == [tid]
    # A task without dedup keeps lower-case letters all the way.
    plain = q.enqueue(url + "&x=1", dedup=False)
    head, body = _split(r, q, plain)
    assert body == "//example.com/catalog/items/0000000001?ref=list&x=1"
    assert head[:1] == "q" and "dd" not in decode_head(head)
    lease = q.claim_next("w:3")
    assert lease is not None and lease.task_id == plain and not lease.task.dedup
    assert _split(r, q, plain)[0][:1] == "r"
    q.complete(lease)
    assert _split(r, q, plain)[0][:1] == "c" and not remembered(r, q.keys, plain)
    assert (q.get(plain).state, q.get(plain).dedup, q.get(plain).url) == ("completed", False, url + "&x=1")
    shown = run(["--redis-url", redis_url, "--namespace", "cr", "task", tid, "--json"])
    assert shown.exit_code == 0, shown.output
    assert (json.loads(shown.stdout)["url"], json.loads(shown.stdout)["dedup"]) == (url, True)
    check_invariants(r, q)


def test_http_urls_and_json_payloads_are_untouched(r: redis.Redis, q: TaskQueue) -> None:
    cases = {
        "http://example.com/h/1": "http://example.com/h/1",
        "https://example.com/m/1": '{"u":"https://example.com/m/1","m":{"a":1}}',  # with meta
        'https://example.com/e/1?q="x"': '{"u":"https://example.com/e/1?q=\\"x\\""}',  # JSON escapes it
    }
    ids = {}
    for url in cases:
        ids[url] = q.enqueue(url, meta={"a": 1} if "/m/" in url else None)
        assert _split(r, q, ids[url])[1] == cases[url], url
    for _ in cases:
        lease = q.claim_next("w:1")
        assert lease is not None
        q.complete(lease)
    for url, tid in ids.items():
        head, body = _split(r, q, tid)
        assert head[:1] == "C" and body == cases[url], url
        info = q.get(tid)
        assert (info.url, info.state, info.meta) == (url, "completed", {"a": 1} if "/m/" in url else {})
    check_invariants(r, q)


#: Heads as earlier releases wrote them for a queued task: compact with dd "1", without dd, JSON.
DEDUP_HEAD = f"q{HEAD_SEP}{CT}{HEAD_SEP}1"
PLAIN_HEAD = f"q{HEAD_SEP}{CT}"
JSON_HEAD = json.dumps({"s": "q", "ct": CT, "dd": "1"}, separators=(",", ":"))
#: Records as earlier releases wrote them: id -> (record, url, dedup).
OLD = {
    "OLDRECORD0A1": (DEDUP_HEAD + "\nhttps://example.com/old/a", "https://example.com/old/a", True),
    "OLDRECORD0B1": (JSON_HEAD + "\nhttps://example.com/old/b", "https://example.com/old/b", True),
    "OLDRECORD0C1": (DEDUP_HEAD + "\nhttp://example.com/old/c", "http://example.com/old/c", True),
    "OLDRECORD0D1": (PLAIN_HEAD + "\nhttps://example.com/old/d", "https://example.com/old/d", False),
    "OLDRECORD0E1": (JSON_HEAD + '\n{"u":"https://example.com/old/e","m":{"k":2}}', "https://example.com/old/e",
                     True),
}


def _put_old(r: redis.Redis, q: TaskQueue) -> None:
    for tid, (raw, _, _) in OLD.items():
        put_raw_record(r, q.keys, tid, raw)
        r.rpush(q.keys.ready_list(0), tid)
    r.zadd(q.keys.ready_bands, {"0": 0})


def test_records_of_the_earlier_forms_are_read_and_written_in_the_new_form(r: redis.Redis, q: TaskQueue,
                                                                          redis_url: str) -> None:
    _put_old(r, q)
    for tid, (raw, url, dedup) in OLD.items():
        info = q.get(tid)
        assert (info.url, info.state, info.dedup) == (url, "queued", dedup), tid
        assert info.created_at == int(CT) / 1000
        assert raw_record(r, q.keys, tid) == raw  # a read writes nothing
    assert [(i.id, i.url) for i in list_tasks(q, "queued")] == [(tid, v[1]) for tid, v in OLD.items()]
    listed = run(["--redis-url", redis_url, "--namespace", "cr", "tasks", "--json"])
    assert listed.exit_code == 0, listed.output
    assert {t["id"]: (t["url"], t["dedup"]) for t in json.loads(listed.stdout)["tasks"]} == \
        {tid: (url, dedup) for tid, (_, url, dedup) in OLD.items()}
    leases = {}
    for _ in OLD:
        lease = q.claim_next("w:1")
        assert lease is not None
        leases[lease.task_id] = lease
    assert list(leases) == list(OLD)  # claim order: the band's
    new_body = {"OLDRECORD0A1": "//example.com/old/a", "OLDRECORD0B1": "//example.com/old/b",
                "OLDRECORD0C1": "http://example.com/old/c", "OLDRECORD0D1": "//example.com/old/d",
                "OLDRECORD0E1": '{"u":"https://example.com/old/e","m":{"k":2}}'}
    for tid, (_, url, dedup) in OLD.items():
        assert leases[tid].url == url and leases[tid].task.dedup == dedup
        head, body = _split(r, q, tid)
        assert head[:1] == ("R" if dedup else "r") and body == new_body[tid], (tid, head, body)
        st = decode_head(head)
        assert (st["s"], st.get("dd"), st["ct"], st["k"]) == ("r", "1" if dedup else None, CT,
                                                              str(leases[tid].token))
        if dedup:
            assert head.split(HEAD_SEP)[2] == ""  # the flag is the letter's case, not the field
    assert q.get("OLDRECORD0E1").meta == {"k": 2}
    # Completed (Lua reads the dedup flag of the old heads: the ids are remembered), or cancelled.
    for tid in ("OLDRECORD0A1", "OLDRECORD0B1", "OLDRECORD0C1", "OLDRECORD0E1"):
        q.complete(leases[tid])
        assert _split(r, q, tid) == ("C" + _split(r, q, tid)[0][1:], new_body[tid])
        assert remembered(r, q.keys, tid), tid
    assert q.cancel("OLDRECORD0D1") == "running"
    assert _split(r, q, "OLDRECORD0D1")[0][:1] == "x" and not remembered(r, q.keys, "OLDRECORD0D1")
    assert [(i.id, i.url) for i in q.dead()] == [("OLDRECORD0D1", "https://example.com/old/d")]
    dead = run(["--redis-url", redis_url, "--namespace", "cr", "dead", "list", "--json"])
    assert dead.exit_code == 0, dead.output
    assert [(t["id"], t["url"], t["dedup"]) for t in json.loads(dead.stdout)["tasks"]] == \
        [("OLDRECORD0D1", "https://example.com/old/d", False)]
    assert completed_matching(q, match="https://example.com/old/*") == \
        ["OLDRECORD0A1", "OLDRECORD0B1", "OLDRECORD0E1"]
    assert completed_matching(q, match="http://*") == ["OLDRECORD0C1"]
    check_invariants(r, q)


def test_an_old_running_record_reclaimed_or_cancelled_is_written_in_the_new_form(r: redis.Redis,
                                                                               q: TaskQueue) -> None:
    sep = HEAD_SEP
    running = f"r{sep}{CT}{sep}1{sep}{sep}{sep}{sep}{sep}{sep}{CT}{sep}1{sep}w:gone\nhttps://example.com/old/r"
    put_raw_record(r, q.keys, "OLDRECORD0R1", running)
    r.zadd(q.keys.running, {"OLDRECORD0R1": 1})  # its lease expired long ago
    put_raw_record(r, q.keys, "OLDRECORD0Q1", f"q{sep}{CT}{sep}1\nhttps://example.com/old/q")
    r.rpush(q.keys.ready_list(0), "OLDRECORD0Q1")
    r.zadd(q.keys.ready_bands, {"0": 0})
    assert q.get("OLDRECORD0R1").state == "running" and q.get("OLDRECORD0R1").dedup
    assert q.reclaim_expired() == 1
    head, body = _split(r, q, "OLDRECORD0R1")
    assert head[:1] == "Q" and body == "//example.com/old/r"
    assert (decode_head(head)["st"], decode_head(head)["dd"]) == ("1", "1")  # one stall
    info = q.get("OLDRECORD0R1")
    assert (info.state, info.stalls, info.dedup, info.url) == ("queued", 1, True, "https://example.com/old/r")
    assert q.cancel("OLDRECORD0Q1") == "queued"
    head, body = _split(r, q, "OLDRECORD0Q1")
    assert head[:1] == "X" and body == "//example.com/old/q"
    assert decode_head(head)["e"] == "cancelled: by the operator" and decode_head(head)["dd"] == "1"
    info = q.get("OLDRECORD0Q1")
    assert (info.state, info.dedup, info.url) == ("dead", True, "https://example.com/old/q")
    check_invariants(r, q)
