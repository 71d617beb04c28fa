"""The compact state head of a record (``_record_codec.lua``'s header, ``HEAD_FIELDS``): the same fields in
the same order in Lua and Python, every field through both and back, the JSON head for what the compact
head cannot hold, and the JSON head of earlier releases read and written compact at the next write."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import redis

import celery_ha.state
from celery_ha.redisio.scripts import script_source
from celery_ha.state import TaskQueue, wait_head
from celery_ha.state.records import (
    DEDUP_LETTERS,
    DEFAULT_TASK,
    HEAD_FIELDS,
    HEAD_SEP,
    STATE_NAMES,
    TaskInfo,
    decode_head,
    encode_head,
)
from celery_ha.state.wait_head import WAIT_FIELDS, WAIT_KINDS, WAIT_MARK, WAIT_TAGS
from tests.support.cli import run
from tests.support.invariants import check_invariants
from tests.support.records import put_raw_record, raw_record

_STATE = Path(celery_ha.state.__file__).parent
_CODEC = (_STATE / "_record_codec.lua").read_text(encoding="utf-8")

#: Every field at once, each value as the scripts or an odd JSON head may hold it (timestamps as they
#: are, decimal ms or not).
EVERY = {"s": "r", "ct": "1796418992826", "dd": "1", "n": "crawl.ñ", "p": "-7", "h": "bücher.example:8080",
         "ma": "9", "ms": "0", "ut": "12.5", "k": "1796418992999", "w": "w:ünï 1", "qt": "0123",
         "a": "2", "st": "1", "due": "1000000000000", "e": "a \"quoted\" | error {}", "pe": "ßé ✓",
         "f": "4", "iv": "86400000", "sg": "9f86d081884c7d65"}
#: Payloads as a record may hold them: an https URL alone as written now ("//...") and by earlier
#: releases (whole), an http URL, a JSON payload (its https URL stays whole), none.
PAYLOADS = ("//example.com/a", "https://example.com/a", "http://example.com/h",
            '{"u":"https://example.com/b","m":{"d":[1,"\\n"]},"t":"00-ab"}', "")


def _written(payload: str) -> str:
    """The payload encode() writes for ``payload``: a bare https URL without its scheme."""
    return "//" + payload[8:] if payload.startswith("https://") else payload


def _lua_list(name: str) -> list[str]:
    match = re.search(r"local " + name + r" = \{(.*?)\}", _CODEC, re.DOTALL)
    assert match, name
    return re.findall(r"'(\w+)'", match.group(1)) or re.findall(r"(\w+) = true", match.group(1))


def test_the_field_order_is_one_in_lua_and_python() -> None:
    assert _lua_list("HEAD_FIELDS") == list(HEAD_FIELDS)
    # The dedup task's letters too: DD_UP and DD_DOWN of _record_codec.lua, DEDUP_LETTERS of records.py.
    up = dict(re.findall(r"(\w) = '(\w)'", re.search(r"local DD_UP = \{(.*?)\}", _CODEC).group(1)))
    down = dict(re.findall(r"(\w) = '(\w)'", re.search(r"local DD_DOWN = \{(.*?)\}", _CODEC).group(1)))
    assert up == DEDUP_LETTERS and down == {v: k for k, v in DEDUP_LETTERS.items()}
    assert set(DEDUP_LETTERS) == set(STATE_NAMES) and all(v.isupper() for v in DEDUP_LETTERS.values())
    assert re.search(r"local HEAD_SEP = '\\31'", _CODEC) and HEAD_SEP == "\x1f"
    assert re.search(r"local DEFAULT_TASK = '(\w+)'", _CODEC).group(1) == DEFAULT_TASK
    # Every field the scripts keep in a record's state (st.<field>) is one of them.
    used = set()
    for path in _STATE.glob("*.lua"):
        used |= set(re.findall(r"\bst\.(\w+)", path.read_text(encoding="utf-8")))
    assert used <= set(HEAD_FIELDS), used - set(HEAD_FIELDS)


def test_the_waiting_head_is_one_in_lua_and_python() -> None:
    """The waiting head's mark, tags, kinds and fields (wait_head.py and _record_codec.lua), its base 62
    (_base62.lua's alphabet) and separator (HEAD_SEP)."""
    assert re.search(r"first == (\d+) then -- '(.)'", _CODEC).groups() == (str(ord(WAIT_MARK)), WAIT_MARK)
    assert re.search(r"local out, o, count, open = \{'(.)'", _CODEC).group(1) == WAIT_MARK
    tags, kinds, positions = re.search(r"local WAIT_FORMS = '([^']*)'", _CODEC).group(1).split(" ")
    assert (tags, kinds) == (WAIT_TAGS, WAIT_KINDS)
    assert tuple(HEAD_FIELDS[ord(c) - ord("A")] for c in positions) == WAIT_FIELDS
    assert len(tags) == 21 and re.search(r"while j <= 21 do", _CODEC)  # the rows' length, in the code
    assert len(WAIT_TAGS) == len(set(WAIT_TAGS)) == len(WAIT_KINDS) == len(WAIT_FIELDS)
    assert set(WAIT_FIELDS) == set(HEAD_FIELDS) - {"s", "dd", "ut"} and set(WAIT_KINDS) == set("iucsxht")
    assert not any(tag.isalnum() or tag in HEAD_SEP + "\n" + WAIT_MARK for tag in WAIT_TAGS)
    # A field's forms are next to each other, in the order encode() tries them.
    assert [f for j, f in enumerate(WAIT_FIELDS) if j == 0 or WAIT_FIELDS[j - 1] != f] == \
        list(dict.fromkeys(WAIT_FIELDS))
    alpha = (_STATE / "_base62.lua").read_text(encoding="utf-8")
    assert re.search(r"local ALPHA = '(\w+)'", alpha).group(1) == wait_head._B62
    assert wait_head._SEP == HEAD_SEP


@pytest.fixture
def codec(tmp_path: Path, r: redis.Redis):
    """decode() then encode() of _record_codec.lua (through _common) on one raw record, with the fields
    given set in between (as a script would): (the state, as a dict, the task name put back; the record
    encode() writes for it; the payload)."""
    folder = tmp_path / "lua"
    shutil.copytree(_STATE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / "codec.lua").write_text("--#include _common\nlocal st, payload = decode(ARGV[2])\n"
                                      "for k, v in pairs(cjson.decode(ARGV[3])) do st[k] = v end\n"
                                      "return {cjson.encode(st), encode(st, payload), payload}\n")
    text = script_source(str(folder), "codec")
    q = TaskQueue(r, "codec")
    keys = q._key_lists[0]

    def call(raw: str, **changes: str) -> tuple[dict[str, str], str, str]:
        state, record, payload = r.eval(text, len(keys), *keys, q.keys.prefix, raw, json.dumps(changes))
        return json.loads(state), record, payload

    return call


def _without_default(st: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in st.items() if not (k == "n" and v == DEFAULT_TASK)}


@pytest.mark.parametrize("fields", [list(HEAD_FIELDS), *([f] for f in HEAD_FIELDS), ["s", "ct", "dd"],
                                    ["s", "ct", "sg"], ["ut", "w"]])
def test_every_field_goes_through_lua_and_python_and_back(codec, fields: list[str]) -> None:
    st = {f: EVERY[f] for f in fields}
    head = encode_head(st)
    assert head[:1] != "{" and "\n" not in head and not head.endswith(HEAD_SEP), head
    assert decode_head(head) == st
    for payload in PAYLOADS:
        state, record, back = codec(head + "\n" + payload)
        assert back == payload
        assert state == {"n": DEFAULT_TASK, **st}  # decode() puts the default task name back
        # Lua writes what Python writes, byte for byte (and an https URL alone without its scheme).
        assert record == head + "\n" + _written(payload)
        # The snapshot of the compact record is the one of the same state as a JSON head.
        as_json = json.dumps(st) + "\n" + payload
        assert TaskInfo.parse("ID", record) == TaskInfo.parse("ID", as_json)
        assert TaskInfo.parse("ID", record) == TaskInfo.parse("ID", head + "\n" + payload)
        # And a JSON head of the same state is written compact by Lua.
        assert codec(as_json)[1] == record


@pytest.mark.parametrize(("field", "value"), [
    ("e", "line one\nline two"), ("e", "a" + HEAD_SEP + "b"), ("w", ""), ("pe", "x\n" + HEAD_SEP),
    ("zz", "a field of a later release"), ("s", "{"), ("s", "{x"), ("n", ""), ("h", "a\nb"),
    ("s", "Q"), ("s", "X"),  # an upper-case letter in a compact head says dedup
    ("s", "~"), ("s", "~q"), ("s", "@c"),  # a head starting so says the host form, the waiting head
])
def test_what_the_compact_head_cannot_hold_is_a_json_head(codec, field: str, value: str) -> None:
    st = {"s": "w", "ct": "1796418992826", "a": "1", field: value}
    payload = "https://example.com/x"
    state, record, _ = codec(json.dumps(st) + "\n" + payload)
    assert state == {"n": DEFAULT_TASK, **st}
    head = record.partition("\n")[0]
    assert head[:1] == "{" and json.loads(head) == st and decode_head(head) == st
    assert encode_head(st)[:1] == "{" and json.loads(encode_head(st)) == st
    info = TaskInfo.parse("ID", record)
    assert (info.state, info.attempts, info.url) == ("delayed", 1, payload) or field == "s"


def test_a_later_release_s_fields_past_the_known_ones_are_kept(codec) -> None:
    head = encode_head({"s": "q", "ct": "1796418992826", "sg": "ab"}) + HEAD_SEP + HEAD_SEP + "new"
    state, record, _ = codec(head + "\nhttps://example.com/n")
    assert state["sg"] == "ab" and record == head + "\n//example.com/n"
    assert decode_head(head) == {"s": "q", "ct": "1796418992826", "sg": "ab", "22": "new"}
    dedup = "Q" + head[1:]  # a dedup task's
    state, record, _ = codec(dedup + "\n//example.com/n")
    assert (state["s"], state["dd"]) == ("q", "1") and record == dedup + "\n//example.com/n"
    assert decode_head(dedup) == {"s": "q", "dd": "1", "ct": "1796418992826", "sg": "ab", "22": "new"}


@pytest.mark.parametrize(("field", "value"), [("w", "a" + HEAD_SEP + "b"), ("w", ""), ("n", "x\ny"),
                                            ("n", ""), ("h", "h\n"), ("e", "two\nlines"), ("sg", ""),
                                            ("qt", ""), ("k", "")])
def test_a_script_setting_such_a_value_writes_the_json_head(codec, field: str, value: str) -> None:
    compact = encode_head({"s": "r", "ct": "1796418992826", "w": "w:1"}) + "\nhttps://example.com/s"
    state, record, _ = codec(compact, **{field: value})
    assert record[:1] == "{" and json.loads(record.partition("\n")[0])[field] == value
    assert {"n": DEFAULT_TASK, **decode_head(record.partition("\n")[0])} == state


def test_unicode_stays_compact(codec) -> None:
    st = {"s": "q", "ct": "1796418992826", "n": "tâche_ü", "w": "日本語", "e": "ошибка"}
    state, record, _ = codec(json.dumps(st, ensure_ascii=False) + "\nhttps://example.com/ü")
    assert record.partition("\n")[0] == encode_head(st) and record[:1] != "{"
    assert state == st and decode_head(encode_head(st)) == st


def test_a_queued_record_is_small(r: redis.Redis, redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "small")
    url = "https://example.com/some/path/that/is/about/sixty/characters/x"
    tid = q.enqueue(url)
    head, _, body = raw_record(r, q.keys, tid).partition("\n")
    assert body == url[6:] == "//example.com/some/path/that/is/about/sixty/characters/x"
    # s (upper-case: dedup), ct; dd is left empty, so it is left out.
    assert len(head) == 15 and head[:2] == "Q" + HEAD_SEP and head[2:].isdigit(), head
    other = q.enqueue(url + "2", task="celery_ha.crawl", dedup=False, priority=3)
    head = raw_record(r, q.keys, other).partition("\n")[0]
    assert head[:1] == "q" and head.split(HEAD_SEP)[2:] == ["", "celery_ha.crawl", "3"]


@pytest.mark.parametrize("letter", list(DEDUP_LETTERS))
def test_a_dedup_task_s_letter_is_upper_case(codec, letter: str) -> None:
    ct = "1796418992826"
    st = {"s": letter, "ct": ct, "dd": "1"}
    new = encode_head(st)
    assert new == DEDUP_LETTERS[letter] + HEAD_SEP + ct and decode_head(new) == st
    old = letter + HEAD_SEP + ct + HEAD_SEP + "1"  # the head earlier releases wrote
    assert decode_head(old) == st
    for head in (new, old, json.dumps(st)):
        state, record, _ = codec(head + "\nhttps://example.com/d")
        assert state == {"n": DEFAULT_TASK, **st}  # the scripts see the lower-case letter and dd
        assert record == new + "\n//example.com/d"
        info = TaskInfo.parse("ID", head + "\nhttps://example.com/d")
        assert (info.state, info.dedup, info.url) == (STATE_NAMES[letter], True, "https://example.com/d")
        assert TaskInfo.parse("ID", record) == info
    # With more fields, through the general way (a field past the 12 unrolled ones) too.
    for extra in ({"w": "w:1", "k": "4"}, {"w": "w:1", "a": "2", "e": "boom"}):
        full = {**st, **extra}
        state, record, _ = codec(encode_head({**extra, "s": letter, "ct": ct}) + "\n", dd="1")
        assert state == {"n": DEFAULT_TASK, **full} and record == encode_head(full) + "\n"
        assert record[:1] == DEDUP_LETTERS[letter] and decode_head(record[:-1]) == full
        assert record.split(HEAD_SEP)[2] == "" and TaskInfo.parse("ID", record).dedup
    # Without dedup the letter stays lower-case, and the dd field of another value stays as it is.
    plain = {"s": letter, "ct": ct}
    assert codec(encode_head(plain) + "\n")[1] == letter + HEAD_SEP + ct + "\n"
    assert not TaskInfo.parse("ID", encode_head(plain) + "\n").dedup
    odd = {"s": letter, "ct": ct, "dd": "yes"}
    assert encode_head(odd) == letter + HEAD_SEP + ct + HEAD_SEP + "yes"
    assert decode_head(encode_head(odd)) == odd
    assert codec(json.dumps(odd) + "\n")[1] == encode_head(odd) + "\n"


def test_an_error_text_of_any_kind_survives_the_lifecycle(r: redis.Redis, redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "errs", backoff_base=0.001, backoff_cap=0.002)
    error = "Traceback:\n  line 1 | x" + HEAD_SEP + " ü {\"j\": 1}"
    tid = q.enqueue("https://example.com/e", task="crawl_e", max_attempts=1)
    lease = q.claim_next("w:1")
    assert lease is not None and lease.task_id == tid
    q.fail(lease, error, retry=True)  # one attempt: dead
    assert raw_record(r, q.keys, tid)[:1] == "{"  # the JSON head holds the newline
    assert q.get(tid).error == error and q.get(tid).state == "dead"
    q.redrive(tid)
    info = q.get(tid)
    assert (info.state, info.previous_error, info.error, info.task) == ("queued", error, None, "crawl_e")
    lease = q.claim_next("w:2")
    assert lease is not None and lease.task.previous_error == error
    q.complete(lease)
    assert q.get(tid).state == "completed" and q.get(tid).previous_error == error
    check_invariants(r, q)


def test_a_json_record_of_an_earlier_release_is_read_and_written_compact(r: redis.Redis,
                                                                          redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "older")
    old = ('{"ms":"3","s":"q","ma":"4","ct":"1796407325451","n":"crawl_old","dd":"1","p":"2"}\n'
           '{"u":"https://example.com/o","m":{"page":3}}')
    put_raw_record(r, q.keys, "OLDRECORD001", old)
    r.rpush(q.keys.ready_list(2), "OLDRECORD001")
    r.zadd(q.keys.ready_bands, {"2": -2})
    info = q.get("OLDRECORD001")
    got = (info.task, info.url, info.meta, info.max_attempts, info.priority, info.created_at, info.dedup)
    assert got == ("crawl_old", "https://example.com/o", {"page": 3}, 4, 2, 1796407325.451, True)
    lease = q.claim_next("w:1")
    assert lease is not None and lease.task_id == "OLDRECORD001" and lease.task.task == "crawl_old"
    head, _, body = raw_record(r, q.keys, "OLDRECORD001").partition("\n")
    assert head[:1] != "{" and body == '{"u":"https://example.com/o","m":{"page":3}}'
    st = decode_head(head)
    assert {k: st[k] for k in ("s", "ct", "n", "ma", "ms", "dd", "p", "k", "w")} == \
        {"s": "r", "ct": "1796407325451", "n": "crawl_old", "ma": "4", "ms": "3", "dd": "1", "p": "2",
         "k": str(lease.token), "w": "w:1"}  # a first token: the Redis clock at the claim
    q.complete(lease)
    info = q.get("OLDRECORD001")
    assert (info.state, info.created_at, info.task, info.meta) == ("completed", 1796407325.451, "crawl_old",
                                                                   {"page": 3})
    check_invariants(r, q)


def test_celery_ha_tasks_lists_compact_records(r: redis.Redis, redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "lt2")
    plain = q.enqueue("https://example.com/l/1")
    own = q.enqueue("https://example.com/l/2", task="crawl_list", priority=4, meta={"ü": 1})
    old = '{"s":"q","ct":"1796407325451","n":"crawl_old"}\nhttps://example.com/l/3'
    put_raw_record(r, q.keys, "OLDRECORD002", old)
    r.rpush(q.keys.ready_list(0), "OLDRECORD002")
    assert raw_record(r, q.keys, plain)[:1] != "{" and raw_record(r, q.keys, own)[:1] != "{"
    result = run(["--redis-url", redis_url, "--namespace", "lt2", "tasks", "--json"])
    assert result.exit_code == 0, result.output
    listed = {t["id"]: t for t in json.loads(result.stdout)["tasks"]}
    assert list(listed) == [own, plain, "OLDRECORD002"]
    for tid, (url, task) in {plain: ("https://example.com/l/1", "fetch_page"),
                             own: ("https://example.com/l/2", "crawl_list"),
                             "OLDRECORD002": ("https://example.com/l/3", "crawl_old")}.items():
        assert (listed[tid]["url"], listed[tid]["task"], listed[tid]["state"]) == (url, task, "queued")
    table = run(["--redis-url", redis_url, "--namespace", "lt2", "tasks"])
    assert table.exit_code == 0 and "crawl_list" in table.stdout and "https://example.com/l/2" in table.stdout
