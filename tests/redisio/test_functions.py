"""The task layer's scripts as one Redis 7 function library (celery_ha/redisio/functions.py): FCALL on
Redis 7 and EVALSHA elsewhere, loaded again when a server lost it, EVALSHA for a user who may not call
or load functions, and every prelude local a call may change set again at the start of each call."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from celery_ha.redisio.functions import PER_CALL, library_text, refuses_functions
from celery_ha.state import TaskQueue

STATE_LUA = Path(__file__).resolve().parents[2] / "celery_ha" / "state"
NAMES = tuple(sorted(p.stem for p in STATE_LUA.glob("*.lua") if not p.stem.startswith("_")))

# Prelude locals a function changes that may keep their value from one call to the next: caches of a
# pure function of their key (the last number formatted, field positions).
PURE_CACHES = {"fmt_n", "fmt_s", "head_pos"}


def _major(r: redis.Redis) -> int:
    return int(str(r.info("server")["redis_version"]).split(".")[0])


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _lifecycle(q: TaskQueue) -> None:
    q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    lease = q.claim_next("w")
    assert lease is not None
    q.complete(lease)
    stats = q.stats()
    assert (stats["completed"], stats["queued"]) == (1, 1)


def _user_url(redis_url: str, user: str, password: str) -> str:
    parts = urlsplit(redis_url)
    return f"redis://{user}:{password}@{parts.hostname}:{parts.port}{parts.path}"


def test_the_task_layer_runs_by_fcall_on_redis_7_and_by_evalsha_before(redis_url: str,
                                                                        r: redis.Redis) -> None:
    r.config_resetstat()
    q = TaskQueue.from_url(redis_url)
    _lifecycle(q)
    library = q._scripts.library
    assert library is not None
    if _major(r) >= 7:
        assert _calls(r, "fcall") >= 2 and library.usable is not False  # the claim, the completion
        assert r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", library.text.name)
    else:
        assert _calls(r, "fcall") == 0 and library.usable is False
        assert _calls(r, "evalsha") >= 3


def test_a_library_the_server_lost_is_loaded_again_and_the_call_runs_once(redis_url: str,
                                                                           r: redis.Redis) -> None:
    if _major(r) < 7:
        pytest.skip("function libraries need Redis 7 (this server is older)")
    q = TaskQueue.from_url(redis_url)
    q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    r.function_flush()  # an operator's FUNCTION FLUSH, or a restart without persistence
    lease = q.claim_next("w")
    assert lease is not None and q.stats()["running"] == 1 and q.stats()["queued"] == 1
    r.function_flush()
    q.complete(lease)
    stats = q.stats()
    assert (stats["completed"], stats["running"], stats["queued"]) == (1, 0, 1)


@pytest.mark.parametrize("denied", ["-fcall", "-function"])
def test_a_user_who_may_not_call_or_load_functions_runs_the_scripts_by_evalsha(
        redis_url: str, r: redis.Redis, denied: str) -> None:
    if _major(r) < 7:
        pytest.skip("ACL rules on FCALL need Redis 7 (this server is older)")
    r.function_flush()  # so that a user who may not load the library has to
    r.acl_setuser("nofn", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all", denied], reset_keys=True, reset_channels=True)
    try:
        q = TaskQueue.from_url(_user_url(redis_url, "nofn", "pw"))
        _lifecycle(q)
        assert q._scripts.library is not None and q._scripts.library.usable is False
    finally:
        r.acl_deluser("nofn")


def test_namespaces_called_in_turn_keep_to_their_own_keys(redis_url: str, r: redis.Redis) -> None:
    """A function library keeps its prelude between calls: a key named from one call's prefix, or a
    cache of one namespace's layout (the gate, the record buckets), must not reach the next call."""
    gated = TaskQueue.from_url(redis_url, namespace="fa", host_gate=True)
    plain = TaskQueue.from_url(redis_url, namespace="fb")
    for i in range(40):
        gated.enqueue(f"https://g{i % 4}.example.com/{i}")
        plain.enqueue(f"https://p.example.com/{i}")
    for _ in range(40):
        for q in (gated, plain):
            lease = q.claim_next("w")
            assert lease is not None
            q.complete(lease)
    for q in (gated, plain):
        stats = q.stats()
        assert (stats["completed"], stats["queued"], stats["running"]) == (40, 0, 0)
    assert not [k for k in r.scan_iter("*hready*") if "fb" in k]
    assert not [k for k in r.scan_iter("*h:g*") if "fb" in k]


def _top_level_locals(text: str) -> dict[str, int]:
    """Names a prelude declares with a top-level ``local`` (not ``local function``) -> offset."""
    out = {}
    for match in re.finditer(r"^local (?!function\b)([\w ,]+?)\s*(?:=|--|$)", text, re.MULTILINE):
        for name in match.group(1).split(","):
            out[name.strip()] = match.start()
    return out


def _assigned_after(text: str, name: str, offset: int) -> bool:
    """Whether ``name`` (or a field of it) is a target of an assignment after ``offset``, outside a
    ``local`` declaration of a function's own."""
    code = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", text[offset:], flags=re.DOTALL)
    for line in code.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("local ") or "=" not in stripped:
            continue
        targets = re.split(r"(?<![=~<>])=(?!=)", stripped, maxsplit=1)[0]
        if len(targets) == len(stripped):
            continue
        for target in targets.split(","):
            if re.fullmatch(rf"(?:if .* then |do |else )?{re.escape(name)}(?:\[.*\]|\.\w+)*", target.strip()):
                return True
    return False


def test_every_prelude_local_a_call_may_change_is_set_again_per_call() -> None:
    library = library_text(str(STATE_LUA), "_common", NAMES)
    assert library is not None
    prelude, _, _ = library.text.partition("local function begin_call(")
    begin = library.text[library.text.index("local function begin_call("):]
    begin = begin[:begin.index("\nredis.register_function(")]
    changed = {name for name, at in _top_level_locals(prelude).items() if _assigned_after(prelude, name, at)}
    assert changed  # the check sees assignments at all
    reset = {name for name in _top_level_locals(prelude) if re.search(rf"\b{name}\b\s*(?:,[^=\n]*)?=", begin)}
    missing = changed - PURE_CACHES - reset
    assert not missing, f"changed by a call, never set again: {missing}"
    assert not PER_CALL.search(prelude), "a per-call block left in the library's shared part"


@pytest.mark.parametrize("text", [
    "this user has no permissions to run the 'fcall' command",  # Redis 7.0
    "User nofn has no permissions to run the 'fcall' command",  # Redis 7.2 and later
    "User nofn has no permissions to run the 'function|load' command",
    "unknown command 'FCALL', with args beginning with: ",  # Redis 6.2
])
def test_every_wording_of_no_functions_means_evalsha(text: str) -> None:
    assert refuses_functions(redis.ResponseError(text))
    assert not refuses_functions(redis.ResponseError(
        "User nofn has no permissions to run the 'select' command script: x, on @user_function:3."))


def test_over_maxmemory_a_transition_runs_as_a_script_would(redis_url: str, r: redis.Redis) -> None:
    """Redis refuses a function that may write before it runs when the server is over maxmemory; a
    script runs until its first write that needs memory, so a completion without items, a hand-back or
    a failure still went through. They still do: the refused FCALL is sent again as EVALSHA."""
    q = TaskQueue.from_url(redis_url)
    q.enqueue_many(["https://example.com/a", "https://example.com/b", "https://example.com/c"])
    held = [q.claim_next("w") for _ in range(3)]
    assert all(held)
    r.config_set("maxmemory", "1")  # far below what the server uses: every write that needs memory fails
    try:
        q.complete(held[0])
        assert q.release(held[1].task_id, token=held[1].token, worker="w") == "queued"
        assert q.fail(held[2], "boom", retry=False) == "dead"
    finally:
        r.config_set("maxmemory", "0")
    stats = q.stats()
    assert (stats["completed"], stats["queued"], stats["dead"], stats["running"]) == (1, 1, 1, 0)


def test_a_library_lost_while_over_maxmemory_is_loaded_again_once_memory_is_back(
        redis_url: str, r: redis.Redis) -> None:
    """The server refuses FUNCTION LOAD while over maxmemory: that call goes by EVALSHA, and the
    library is loaded by a later call once there is memory again (FCALL is not given up for good)."""
    if _major(r) < 7:
        pytest.skip("function libraries need Redis 7 (this server is older)")
    q = TaskQueue.from_url(redis_url)
    q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    held = q.claim_next("w")
    assert held is not None
    library = q._scripts.library
    r.function_flush()  # a restart without persistence, say, while the server is full
    r.config_set("maxmemory", "1")
    try:
        q.complete(held)  # the reload is refused: this call runs by EVALSHA
    finally:
        r.config_set("maxmemory", "0")
    assert library.usable is not False
    r.config_resetstat()
    _lease = q.claim_next("w")
    assert _lease is not None and _calls(r, "fcall") >= 1 and _calls(r, "evalsha") == 0
    assert r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", library.text.name)
    assert q.stats()["completed"] == 1


def test_the_library_name_is_a_digest_of_all_it_runs() -> None:
    """A release that changes only the wrapper (flags, begin_call) gets a library of its own, not an
    older one found "already there"."""
    library = library_text(str(STATE_LUA), "_common", NAMES)
    assert library is not None
    body = library.text.split("\n", 1)[1].replace(library.name, "@LIBRARY@")
    assert library.name == "celery_ha_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:12]


def test_the_library_keeps_clear_of_lua_limits() -> None:
    """Lua 5.1 allows 200 locals in a function (the library's main chunk holds every helper of the
    prelude) and 60 upvalues (begin_call sets every per-call local): a library past either would not
    load, and its scripts would fall back to EVALSHA."""
    for folder in (STATE_LUA, STATE_LUA.parent / "proxy"):
        names = tuple(sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_")))
        library = library_text(str(folder), "_common", names)
        assert library is not None
        prelude = library.text.partition("local function begin_call(")[0]
        functions = re.findall(r"^local function (\w+)\(", prelude, re.MULTILINE)
        top = set(_top_level_locals(prelude)) | set(functions)
        # 190: ten of Lua's 200 left for begin_call and what the library's text adds around the prelude
        assert len(top) <= 190, f"{folder.name}: {len(top)} top-level locals of Lua's 200"
        begin = library.text[library.text.index("local function begin_call("):]
        begin = begin[:begin.index("\nredis.register_function(")]
        upvalues = {name for name in top if re.search(rf"\b{name}\b", begin)}
        assert len(upvalues) <= 55, f"{folder.name}: begin_call uses {len(upvalues)} upvalues of Lua's 60"
