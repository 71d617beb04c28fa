"""The waiting head (_record_codec.lua's header, state/wait_head.py): a finished record with a refetch
schedule is written small, read back as the very state the compact or JSON head gave (Lua and Python,
byte for byte the same head), and a state it cannot hold keeps the forms of before. Real Redis, the
real scripts."""

from __future__ import annotations

import json
import random

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.records import (
    DEFAULT_TASK,
    HEAD_SEP,
    TaskInfo,
    decode_head,
    decode_state,
    encode_head,
    payload_host,
)
from celery_ha.state.wait_head import WAIT_MARK
from tests.state.test_compact_head import codec  # noqa: F401  (the fixture: Lua decode() then encode())
from tests.support.celery_helpers import wait_for
from tests.support.invariants import check_invariants
from tests.support.records import raw_record

UT = "1796625635669"
#: A scheduled page's record after its first run, as the compact head wrote it (71 bytes of head).
WAITING = {"s": "c", "dd": "1", "ct": "1796625559649", "n": "page", "ut": UT, "k": "1796625635668",
           "iv": "604800000"}
PAYLOADS = ("//shop-817.example.com/catalog/items/0000168817?ref=list", "https://shop-817.example.com/a",
            "http://shop-817.example.com:8080/h", '{"u":"https://shop-817.example.com/j","m":{"p":1}}', "")
HOST = "shop-817.example.com"


def _written(payload: str) -> str:
    return "//" + payload[8:] if payload.startswith("https://") else payload


def _old_compact(st: dict[str, str]) -> str:
    """The compact head of before (HEAD_FIELDS order): what the waiting head replaces."""
    return encode_head({k: v for k, v in st.items() if k != "iv"}) + HEAD_SEP * 9 + st["iv"]


def _through_both(codec, st: dict[str, str], payload: str) -> str:  # noqa: F811
    """Check ``st`` through Python and Lua and back; return the head Lua writes."""
    written = _written(payload)
    head = encode_head(st, written)
    state, record, back = codec(json.dumps(st) + "\n" + payload)
    assert back == payload  # decode()'s payload, as stored
    assert state == {"n": DEFAULT_TASK, **st}, (st, head)  # decode() as from the JSON head
    assert record == head + "\n" + written, (st, payload)  # Lua writes what Python writes
    state, again, _ = codec(record)  # and reads its own record back to the same state
    assert state == {"n": DEFAULT_TASK, **st} and again == record
    assert decode_state(record) == st
    assert TaskInfo.parse("ID", record) == TaskInfo.parse("ID", json.dumps(st) + "\n" + payload)
    return head


def test_a_scheduled_page_s_head_is_small(codec) -> None:  # noqa: F811
    for payload in PAYLOADS:
        head = _through_both(codec, WAITING, payload)
        assert head == "@CVd624XN,Jm8.1!2XKq#page", head  # ut, ct = ut - 76020, k = ut - 1, iv = 1w
    assert len(_old_compact(WAITING)) == 71
    later = {**WAITING, "ut": str(int(UT) + 3 * 604800000), "k": str(int(WAITING["k"]) + 3)}
    assert _through_both(codec, later, PAYLOADS[0]).startswith(WAIT_MARK + "C")  # k from ct now
    assert len(encode_head(later)) <= 30


@pytest.mark.parametrize("extra", [
    {}, {"dd": None}, {"s": "x", "a": "3", "e": "FetchError: HTTP 503", "f": "1"},
    {"s": "x", "dd": None, "st": "4", "e": "stalled", "pe": "earlier | {\"j\": ü}"},
    {"sg": "9f86d081884c7d65"}, {"sg": "9F86D081884C7D65"}, {"sg": "ffffffffffffffff"}, {"sg": "0" * 16},
    {"sg": "abc"}, {"h": HOST}, {"h": "other.example"}, {"h": HOST, "n": None, "sg": "00000000ffffffff"},
    {"p": "9", "ma": "5", "ms": "0", "qt": "1796625635000", "due": "1796625699999", "w": "w:1 ü"},
    {"iv": "1234"}, {"iv": "1000"}, {"iv": "0"}, {"ct": UT}, {"k": UT}, {"k": "1796625559649"},
    {"k": "1796625559650"}, {"k": "1796625635670"}, {"n": "crawl.ñ/日本"}, {"ut": "0", "ct": "0", "k": "0"},
    {"ut": "999999999999999", "k": "1"}, {"ct": None, "k": None}, {"n": None},
])
def test_every_field_and_form_goes_through_lua_and_python(codec, extra: dict[str, str | None]) -> None:  # noqa: F811
    st = {k: v for k, v in {**WAITING, **extra}.items() if v is not None}
    for payload in PAYLOADS:
        head = _through_both(codec, st, payload)
        assert head[:2] == WAIT_MARK + ("C" if st.get("dd") else "c") if st["s"] == "c" else head[:1] == "@"
        if "h" in st:  # the payload's own host is a tag without a value
            assert (st["h"] in head) != (st["h"] == payload_host(_written(payload))), (st, payload)


@pytest.mark.parametrize("extra", [
    {"ut": None}, {"ut": "12.5"}, {"ut": "0123"}, {"ut": "1" * 16}, {"ct": str(int(UT) + 1)}, {"ct": "-5"},
    {"k": str(int(UT) + 1), "ct": None}, {"p": "-7"}, {"a": "+1"}, {"iv": "1e9"}, {"dd": "yes"},
    {"e": "two\nlines"}, {"n": "a" + HEAD_SEP + "b"}, {"w": ""}, {"sg": "x" + HEAD_SEP}, {"zz": "new field"},
    {"s": "r"}, {"s": "q"}, {"s": "w"}, {"s": "d"}, {"iv": None},
])
def test_a_state_the_waiting_head_cannot_hold_keeps_the_forms_of_before(codec, extra) -> None:  # noqa: F811
    st = {k: v for k, v in {**WAITING, **extra}.items() if v is not None}
    head = encode_head(st, PAYLOADS[0])
    assert head[:1] != WAIT_MARK and head == encode_head(st)  # compact (or JSON) as before
    state, record, _ = codec(json.dumps(st) + "\n" + PAYLOADS[0])
    assert state == {"n": DEFAULT_TASK, **st}
    written = record.partition("\n")[0]
    if head[:1] == "{":  # a value no compact head holds: JSON (cjson orders and escapes its own way)
        assert written[:1] == "{" and json.loads(written) == st
    else:
        assert written in (head, "~" + head.replace(HOST, "", 1))
    assert decode_state(record) == st


def _random_state(rnd: random.Random) -> dict[str, str]:
    """A finished state with a schedule, its values as the scripts make them or odd ones."""
    ut = rnd.choice([int(UT), rnd.randrange(0, 62 ** 7), rnd.randrange(0, 10 ** 15)])

    def number(near: int) -> str:
        if rnd.random() < 0.97:
            return rnd.choice([str(near), str(max(0, near + rnd.randrange(-10 ** 9, 10 ** 9))),
                               str(rnd.randrange(5))])
        return rnd.choice(["0" + str(rnd.randrange(9)), "-" + str(rnd.randrange(1, 9)), "1.5"])

    st = {"s": rnd.choice("cx"), "ut": str(ut) if rnd.random() < 0.95 else number(ut),
          "iv": number(604800000)}
    if rnd.random() < 0.6:
        st["dd"] = "1" if rnd.random() < 0.97 else "2"
    for name in ("ct", "k", "qt", "due"):
        if rnd.random() < 0.6:
            st[name] = number(ut - rnd.randrange(0, 10 ** 10))
    for name in ("p", "ma", "ms", "a", "st", "f"):
        if rnd.random() < 0.3:
            st[name] = number(rnd.randrange(10))
    texts = ["page", "crawl.ñ", "w:1", "a | b {c}", "~", "@", "#x", ",", "%_"]
    for name in ("n", "h", "w", "e", "pe"):
        if rnd.random() < 0.3:  # (an h of "~" is decode_state's HOST_MARK in any head)
            st[name] = rnd.choice([*(texts if name != "h" else texts[:4]), HOST] * 3 + ["x\ny", HEAD_SEP])
    if rnd.random() < 0.5:
        st["sg"] = rnd.choice([f"{rnd.getrandbits(64):016x}", f"{rnd.getrandbits(64):016X}", "abc", "="])
    return st


def test_random_states_read_back_the_same(codec) -> None:  # noqa: F811
    rnd = random.Random(30)
    waiting = 0
    for _ in range(300):
        st = _random_state(rnd)
        payload = rnd.choice(PAYLOADS)
        head = encode_head(st, _written(payload))
        state, record, _ = codec(json.dumps(st) + "\n" + payload)
        assert state == {"n": DEFAULT_TASK, **st}, st
        if head[:1] == "{":  # a newline or a separator in a value: JSON, escaped by cjson its own way
            assert record[:1] == "{" and json.loads(record.partition("\n")[0]) == st
            continue
        assert record.partition("\n")[0] in (head, "~" + head.replace(HOST, "", 1)), st
        assert codec(record)[0] == state and decode_state(record) == st
        if head[:1] == WAIT_MARK:  # (its integers are integers: TaskInfo reads them)
            assert TaskInfo.parse("ID", record) == TaskInfo.parse("ID", json.dumps(st) + "\n" + payload)
            waiting += 1
    assert waiting > 100  # most of them took the waiting head


def test_a_weekly_scheduled_url_waits_in_a_small_record(r: redis.Redis, redis_url: str) -> None:
    """What a scheduled crawl keeps per URL between its runs: the waiting head (gated, adaptive)."""
    q = TaskQueue.from_url(redis_url, "wh", history_max=10, host_gate=True)
    q.set_schedule("page", every="1w", adaptive=True)
    url = "https://shop-817.example.com/catalog/items/0000168817?ref=list"  # 62 characters
    tid = q.enqueue(url, task="page")
    assert raw_record(r, q.keys, tid)[:1] == "~"  # queued, gated: the compact head, the host left out
    lease = q.claim(tid, "w:1")
    assert lease is not None and raw_record(r, q.keys, tid)[:2] == "~R"
    lease.verdict = "9f86d081884c7d65"
    q.complete(lease)
    record = raw_record(r, q.keys, tid)
    head, _, body = record.partition("\n")
    # '@', 'C', ut (7), ct and k (from ut: <= 5 each), iv (5), the host (1), sg (13), n (5): <= 45 bytes;
    # the compact head was 118 (the host key and the signature in full, 13-digit decimal times).
    assert head[:2] == "@C" and len(head) <= 45 and body == url[6:], head
    assert decode_head(head)["h"] == "~" and decode_state(record)["h"] == HOST
    info = q.get(tid)
    assert (info.state, info.refetch_every, info.host, info.signature, info.task, info.url, info.dedup) == \
        ("completed", 604800, HOST, "9f86d081884c7d65", "page", url, True)
    check_invariants(r, q)


def test_a_scheduled_url_runs_again_from_its_waiting_record(r: redis.Redis, redis_url: str) -> None:
    """Queued and running in the compact head, waiting (completed, or dead) in the waiting head, queued
    again from it by refetch_due, as many times as it runs."""
    q = TaskQueue.from_url(redis_url, "wr", history_max=10, max_attempts=1)
    q.set_schedule("page", every=1)
    url = "https://shop-817.example.com/p?ref=list"
    tid = q.enqueue(url, task="page")
    for run in range(3):
        lease = q.claim(tid, "w:1")
        assert lease is not None and raw_record(r, q.keys, tid)[:1] in "RQ"
        if run < 2:
            q.complete(lease)
            expected = ("completed", None)
        else:
            q.fail(lease, "FetchError: HTTP 503", retry=True)  # its one attempt spent: dead, still scheduled
            expected = ("dead", "FetchError: HTTP 503")
        head = raw_record(r, q.keys, tid).partition("\n")[0]
        assert head[:2] == ("@C" if run < 2 else "@X") and len(head) <= 30 + 21, head
        info = q.get(tid)
        assert (info.state, info.error) == expected and (info.refetch_every, info.url) == (1, url)
        check_invariants(r, q)
        wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the scheduled run")
        head = raw_record(r, q.keys, tid).partition("\n")[0]
        assert head[:1] == "Q" and q.get(tid).state == "queued"  # the compact head again
        check_invariants(r, q)
    assert q.get(tid).previous_error == "FetchError: HTTP 503"
