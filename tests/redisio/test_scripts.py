"""The Lua script caller: NOSCRIPT recovery, reconnects, and never running a transition twice."""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import threading
from pathlib import Path

import pytest
import redis

from celery_ha.base.errors import LeaseLost, TaskNotFound
from celery_ha.redisio.scripts import LuaScript, _function_blocks, prune_functions, script_source
from celery_ha.state import Refusal, TaskQueue, task_id_for
from celery_ha.state.ids import ALPHABET
from celery_ha.state.replies import REASONS, raise_for, reason, refused

# Counts its runs, then keeps Redis busy for ~300 ms (longer than the client's socket timeout below).
SLOW_INCR = """
redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > 300000
return 1
"""


def test_noscript_after_script_flush_is_recovered(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/a")
    r.script_flush()
    q.enqueue("https://example.com/b")
    lease = q.claim_next("w")
    assert lease is not None and lease.url == "https://example.com/a"
    r.script_flush()
    q.complete(lease)
    assert q.stats()["completed"] == 1 and q.stats()["queued"] == 1


def test_a_killed_connection_is_replaced(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/a")
    r.client_kill_filter(_type="normal", skipme=True)  # every connection but this test's own
    q.enqueue("https://example.com/b")
    assert q.stats()["queued"] == 2


@pytest.mark.parametrize("single_connection", [False, True])
def test_a_lost_reply_is_never_answered_by_running_the_script_again(
        redis_url: str, r: redis.Redis, single_connection: bool) -> None:
    """redis-py retries a command whose reply timed out; a claim or completion must not run twice."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.05,
                                  single_connection_client=single_connection)
    script = LuaScript(client, SLOW_INCR)
    r.script_load(SLOW_INCR)
    with pytest.raises(redis.TimeoutError):
        script(keys=["runs"])
    # Any re-sent request was written before this PING, so Redis has run it by the time it answers.
    assert r.ping()
    assert r.get("runs") == "1"


def test_each_thread_gives_its_connection_back_when_it_ends(redis_url: str) -> None:
    """Threads pin a pooled connection; 10 short-lived threads must fit in a pool of 2."""
    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(
        redis_url, decode_responses=True, max_connections=2))
    q = TaskQueue(client)
    for i in range(10):
        worker = threading.Thread(target=q.enqueue, args=(f"https://example.com/{i}",))
        worker.start()
        worker.join()
        gc.collect()
    assert q.stats()["queued"] == 10  # stats() itself needs a free pool connection


def test_a_forked_child_never_shares_its_parents_socket(redis_url: str) -> None:
    """Parent and child call scripts at the same time after a fork: a shared socket would mix replies."""
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/warm")  # the parent pins a connection before forking
    urls = {side: [f"https://example.com/{side}/{i}" for i in range(300)] for side in ("parent", "child")}
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_enqueue_and_check, args=(q, urls["child"]))
    child.start()
    _enqueue_and_check(q, urls["parent"])
    child.join(timeout=60)
    assert child.exitcode == 0
    assert q.stats()["queued"] == 601


def _enqueue_and_check(q: TaskQueue, urls: list[str]) -> None:
    for url in urls:
        assert q.enqueue(url) == task_id_for("fetch_page", url)
        # Each process writes only on sockets it opened itself (a connection records its opener's pid).
        assert q._scripts.enqueue._pins.acquire().pid == os.getpid()


# ---------------------------------------------------------------- script contracts and refusal codes
STATE_LUA = Path(__file__).resolve().parents[2] / "celery_ha" / "state"
SHARED_KEYS = {"K_TASKS": 1, "K_READYP": 2, "K_DELAYED": 3, "K_INFLIGHT": 4, "K_RUNNING": 5, "K_DEAD": 6,
               "K_COMPLETED": 7, "K_DONE": 8, "K_CKPT": 9, "K_STATS": 10, "K_WAKE": 11,
               "K_HIST": 12}


def test_lua_refusal_codes_match_python() -> None:
    """_replies.lua defines the codes the scripts answer; replies.Refusal must mirror it exactly."""
    text = (STATE_LUA / "_replies.lua").read_text()
    defined = {name: int(value) for name, value in re.findall(r"^local R_(\w+) = (-\d+)$", text, re.M)}
    documented = {name: int(value) for value, name in re.findall(r"^ +(-\d+) R_(\w+) ", text, re.M)}
    assert defined == documented == {member.name: member.value for member in Refusal}
    assert set(REASONS) == set(Refusal)


@pytest.mark.parametrize("code", list(Refusal))
def test_each_refusal_code_maps_to_its_error_and_reason(code: Refusal) -> None:
    with pytest.raises(LeaseLost) as lost:
        raise_for(code, "T1", 7)
    assert str(lost.value) == f"lease on task T1 (token 7) is lost: {REASONS[code]}"
    assert refused(int(code)) and reason(code) == REASONS[code]
    if code == Refusal.UNKNOWN:
        with pytest.raises(TaskNotFound) as missing:
            raise_for(code, "T1", namespace="ns")
        assert str(missing.value) == "no task 'T1' in namespace 'ns'"
    else:  # without a lease a refusal is an answer (None or 0), not an error
        with pytest.raises(ValueError):
            raise_for(code, "T1")


def test_success_replies_are_never_refusals() -> None:
    for reply in (0, 1, 17, "1700000000000", "q", "x", [1], ["retry", "1"], [], None):
        assert not refused(reply)
    assert reason(-99).endswith("code -99")


def _prelude_functions() -> dict[str, str]:
    """name -> body of every function the shared includes define."""
    out: dict[str, str] = {}
    for include in ("_common", "_record_codec", "_replies", "_dispatch", "_refetch", "_remembered",
                    "_records"):
        parts = re.split(r"^local function (\w+)", (STATE_LUA / f"{include}.lua").read_text(), flags=re.M)
        out.update(zip(parts[1::2], parts[2::2], strict=True))
    return out


def _keys_used(body: str, seen: frozenset[str] = frozenset()) -> set[int]:
    """The KEYS slots ``body`` reads, directly or through the prelude functions it calls."""
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}
    used |= {slot for name, slot in SHARED_KEYS.items() if re.search(rf"\b{name}\b", body)}
    for name, inner in _prelude_functions().items():
        if name not in seen and re.search(rf"(?<![\w.:]){name}\(", body):
            used |= _keys_used(inner, seen | {name})
    return used


@pytest.mark.parametrize("path", sorted(p for p in STATE_LUA.glob("*.lua")), ids=lambda p: p.name)
def test_every_state_script_opens_with_its_contract(path: Path) -> None:
    """BullMQ-style header: each KEYS and ARGV slot the script itself reads, and its replies."""
    text = path.read_text()
    assert text.startswith("--[[ "), "no --[[ ... ]] header block"
    header, _, body = text.partition("]]")
    if path.stem.startswith("_"):
        assert "Defines:" in header
        return
    assert "Reply:" in header
    documented_argv = {int(n) for n in re.findall(r"^  ARGV\[(\d+)\]", header, re.M)}
    for start in re.findall(r"^  ARGV\[(\d+)\.\.\]", header, re.M):
        documented_argv |= set(range(int(start), 64))
    used_argv = {int(n) for n in re.findall(r"ARGV\[(\d+)", body)}
    assert used_argv <= documented_argv, f"undocumented ARGV slots {used_argv - documented_argv}"
    documented_keys = {int(n) for n in re.findall(r"^  KEYS\[(\d+)\]", header, re.M)}
    assert _keys_used(body) == documented_keys
    for code in set(re.findall(r"\bR_[A-Z_]+\b", body)):
        assert code in header, f"reply {code} not documented"


def test_a_script_defines_only_the_functions_it_calls() -> None:
    """The loader drops the include functions a script never reaches (each one is a closure made per
    call): kept what the body or a kept function calls, dropped what only a comment or a dropped
    function names."""
    text = ("local K = KEYS[1]\n"
            "local function helper(x)\n  return x\nend\n"
            "local function used(x)\n  return helper(x)\nend\n"
            "-- unused() is named here only\n"
            "local function unused()\n  return only_from_unused()\nend\n"
            "local function only_from_unused()\n  return 1\nend\n"
            "return used(K)\n")
    assert prune_functions(text) == ("local K = KEYS[1]\n"
                                     "local function helper(x)\n  return x\nend\n"
                                     "local function used(x)\n  return helper(x)\nend\n"
                                     "-- unused() is named here only\n"
                                     "return used(K)\n")
    one_liners = ("local function key(h) return 'h:' .. h end\n"
                  "local function gone(h) return 'x:' .. h end\n"
                  "local function opens(x) if x then return end\n  return 1\nend\n"
                  "return key('a') .. opens(1)\n")
    gone = "local function gone(h) return 'x:' .. h end\n"
    assert prune_functions(one_liners) == one_liners.replace(gone, "")
    odd = "local function f()\nreturn 1\nend\nlocal function g()\n  return 2\nend\nreturn f()\n"
    assert prune_functions(odd) == odd  # a body line not indented: kept whole
    claim = script_source(str(STATE_LUA), "claim")
    assert "local function grant(" in claim and "local function store_items(" not in claim
    assert "local function fill_window(" in script_source(str(STATE_LUA), "complete_dispatch")


def test_the_base62_tables_agree_with_the_id_alphabet(r: redis.Redis) -> None:
    """``_base62.lua``'s IDX and CHR fill on first use: every byte maps as the id alphabet says, any
    other byte (and a nil, a short id's missing character) to nil, every index back to its byte."""
    base = (STATE_LUA / "_base62.lua").read_text(encoding="utf-8")
    probe = base + """
local idx, chr = {}, {}
for b = 0, 255 do idx[#idx + 1] = IDX[b] or -1 end
for b = 0, 255 do idx[#idx + 1] = IDX[b] or -1 end  -- again: the kept entries answer the same
for i = 0, 61 do chr[#chr + 1] = CHR[i] end
return {idx, chr, IDX[nil] == nil and CHR[-1] == nil and CHR[62] == nil and CHR[1.5] == nil and 1 or 0}
"""
    idx, chr_, edges = r.eval(probe, 0)
    want = [ALPHABET.index(chr(b)) if chr(b) in ALPHABET else -1 for b in range(256)]
    assert idx == want + want
    assert chr_ == [ord(c) for c in ALPHABET]
    assert edges == 1


@pytest.mark.parametrize("name", sorted(p.stem for p in STATE_LUA.glob("*.lua") if p.stem[0] != "_"))
def test_a_function_calls_only_functions_defined_before_it(name: str) -> None:
    """A Lua local is visible only after its definition: a function that calls one defined later
    reads a global that does not exist, and fails only when that line runs. Names a function
    defines inside itself, and its own, are its own."""
    text = script_source(str(STATE_LUA), name)
    blocks = _function_blocks(text)
    assert blocks is not None, f"{name}: layout not read"
    defined_at = {block: start for block, start, _ in blocks}
    for block, start, end in blocks:
        body = re.sub(r"--[^\n]*", "", text[start:end])
        own = set(re.findall(r"local function (\w+)\(", body))
        for called in set(re.findall(r"(?<![\w.:])(\w+)\(", body)) - own:
            assert defined_at.get(called, -1) < start, f"{name}: {block}() calls {called}(), defined after it"
