"""Every Lua script of the state layer and the proxy pool, run on a real Redis Cluster, is cluster-clean.

A script may touch only keys of the slot it is routed to: the keys it declares, or keys it builds from
the namespace prefix (same ``{…}`` hash tag), documented in its header. Redis 7 rejects a declared key
of another slot (CROSSSLOT) and an undeclared key served by another node, but it runs an undeclared key
of *another slot on the same node* without a word, and that script breaks the day the slot moves. So
the test also watches every node with MONITOR while each script runs and checks, command by command,
that each key a script touched hashes to its routed slot.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.functions import library_text
from celery_ha.redisio.lock import short_lock
from celery_ha.redisio.scripts import SHARED_LUA, script_source
from celery_ha.state import TaskQueue
from celery_ha.state.migrate import Migration
from celery_ha.state.replay import enqueue_if_absent
from celery_ha.state.taskqueue import ROW_SCRIPTS
from celery_ha.state.validators import store_validator
from celery_ha.state.worker_registry import heartbeat
from tests.support.redis_cluster import RedisClusterGroup

PACKAGE = Path(__file__).resolve().parents[2] / "celery_ha"
FOLDERS = (PACKAGE / "state", PACKAGE / "proxy")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b", '"': '"', "\\": "\\"}


def every_script() -> dict[str, str]:
    """sha1 (or function name) -> "folder/name" of every script a client can run (includes are part of
    their scripts)."""
    out = {}
    for folder in FOLDERS:
        for path in sorted(folder.glob("*.lua")):
            if not path.stem.startswith("_"):
                source = script_source(str(folder), path.stem)
                out[hashlib.sha1(source.encode()).hexdigest()] = f"{folder.name}/{path.stem}"
    source = script_source(str(SHARED_LUA), "unlock")
    out[hashlib.sha1(source.encode()).hexdigest()] = "redisio/unlock"
    # FCALL of the function libraries (Redis 7): their functions' names, the same labels
    for folder in FOLDERS:
        names = tuple(sorted(p.stem for p in folder.glob("*.lua")
                             if not p.stem.startswith("_") and p.stem not in ROW_SCRIPTS))
        library = library_text(str(folder), "_common", names)
        assert library is not None
        out.update({function: f"{folder.name}/{name}" for name, function in library.functions.items()})
    return out


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x":
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass
class Call:
    script: str
    declared: list[str]
    inner: list[list[str]] = field(default_factory=list)


class Monitor:
    """MONITOR on every master, in threads, until :meth:`stop`; then :meth:`calls` groups what each
    script ran (a node runs a script's commands right after its EVAL/EVALSHA/FCALL line, nothing between)."""

    def __init__(self, group: RedisClusterGroup) -> None:
        self.lines: list[list[str]] = [[] for _ in group.nodes]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(node.port, n), daemon=True)
                         for n, node in enumerate(group.nodes)]
        self._ready = threading.Barrier(len(group.nodes) + 1, timeout=10)
        for thread in self._threads:
            thread.start()
        self._ready.wait()

    def _watch(self, port: int, n: int) -> None:
        # A read that times out disconnects redis-py's connection (the stream would be lost), so the
        # thread waits for data with can_read and reads only a line that has arrived.
        conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=10)
        conn.connect()
        conn.send_command("MONITOR")
        conn.read_response()
        self._ready.wait()
        try:
            while True:
                if conn.can_read(timeout=0.2):
                    self.lines[n].append(conn.read_response().decode("utf-8", "replace"))
                elif self._stop.is_set():
                    break
        except Exception as exc:  # a broken stream: the test must not pass on what it did not see
            self.errors.append(f"node {n}: {type(exc).__name__}: {exc}")
        finally:
            conn.disconnect()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def calls(self, names: dict[str, str]) -> list[Call]:
        out: list[Call] = []
        for lines in self.lines:
            current: Call | None = None
            for line in lines:
                args = [_unescape(a) for a in _QUOTED.findall(line)]
                if not args:
                    continue
                if " [0 lua] " in line or "[0 lua]" in line.split('"', 1)[0]:
                    if current is not None:
                        current.inner.append(args)
                    continue
                current = None
                command = args[0].upper()
                if command in ("EVALSHA", "EVAL", "FCALL") and len(args) >= 3:
                    sha = args[1] if command != "EVAL" else hashlib.sha1(args[1].encode()).hexdigest()
                    nkeys = int(args[2])
                    current = Call(names.get(sha, f"unknown script {sha[:8]}"), args[3:3 + nkeys])
                    out.append(current)
        return out


def _keys_of(node: redis.Redis, args: list[str], cache: dict[tuple[str, ...], list[str]]) -> list[str]:
    """The key arguments of one command, as the server itself reads them (COMMAND GETKEYS)."""
    probe = tuple(args)
    if probe not in cache:
        try:
            cache[probe] = list(node.command_getkeys(*args))
        except redis.ResponseError:  # a command without keys (TIME)
            cache[probe] = []
    return cache[probe]


def check_slots(calls: list[Call], group: RedisClusterGroup) -> tuple[list[str], dict[str, set[str]]]:
    """(keys touched outside the routed slot, keys each script built itself inside it)."""
    slot_of = group.client().keyslot
    node = group.node_client(0)
    cache: dict[tuple[str, ...], list[str]] = {}
    outside: list[str] = []
    computed: dict[str, set[str]] = {}
    for call in calls:
        assert call.declared, f"{call.script} declares no key: it cannot be routed"
        slot = slot_of(call.declared[0])
        assert {slot_of(k) for k in call.declared} == {slot}, f"{call.script}: declared keys in two slots"
        for args in call.inner:
            for key in _keys_of(node, args, cache):
                if slot_of(key) != slot:
                    outside.append(f"{call.script}: {args[0]} {key!r} is not in slot {slot}")
                elif key not in call.declared:
                    computed.setdefault(call.script, set()).add(key)
    return outside, computed


def _run_every_script(url: str) -> None:
    """Each transition of the task layer and each operation of the proxy pool, at least once."""
    client = redis_client(url)
    q = TaskQueue(client, "sc", lease_ttl=30, backoff_base=0, backoff_cap=0)
    q.set_schedule(q.default_task, every=60)  # completions schedule a refetch (_refetch.lua)
    q.set_schedule(host="example.com", every=120)
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(8)])  # enqueue
    enqueue_if_absent(q, [("fixedid00001", "https://example.com/fixed")])  # enqueue_if_absent
    sent = q.dispatch(2)  # dispatch
    lease = q.claim(sent[0].task_id, "w1")  # claim
    assert lease is not None
    q.renew(lease)  # renew
    q.save_checkpoint(lease, {"page": 2})  # checkpoint
    q.commit(lease, [("k1", {"v": 1})])  # commit
    nxt = q.complete_and_claim(lease)  # complete_next
    assert nxt is not None
    q.complete(nxt)  # complete
    fourth = q.claim(sent[1].task_id, "w1")
    assert fourth is not None
    assert q.complete_and_dispatch(fourth, [("k2", {"v": 2})], window=2)[0] == 1  # complete_dispatch
    pair = q.enqueue_many(["https://example.com/pair/1", "https://example.com/pair/2"])
    added, second = q.complete_and_claim_id(q.claim(pair[0], "w1"), pair[1], "w1", [("k3", {"v": 3})])
    assert added == 1 and second is not None  # complete_claim
    q.complete(second)
    held = q.claim_next("w1")  # claim_next
    assert held is not None
    assert q.fail(held, "boom", retry=False) == "dead"  # fail
    assert q.redrive(held.task_id) == 1  # redrive
    again = q.claim_next("w2", ttl=0.001)
    assert again is not None
    assert q.reclaim_expired() >= 0  # reclaim
    third = q.claim_next("w3")
    assert third is not None and q.release(third.task_id, worker="w3") == "queued"  # release
    q.cancel(ids[-1])  # cancel
    assert q.get(ids[0]) is not None  # records (a read)
    q.hosts.set("example.com", concurrency=4)  # host_limits
    q.hosts.block("example.com", 1)  # host_block
    q.hosts.unblock("example.com")
    assert q.recrawl([nxt.task_id]) == {nxt.task_id: "queued"}  # recrawl
    store_validator(q, nxt.task_id, 'e:"v1"', unchanged=True)  # validators
    client.sadd(q.keys.legacy_seen, "oldid0000001")  # a 0.1 release's dedup set, and the sorted set
    client.zadd(q.keys.done, {"oldid0000002": 1})  # of the layout before the buckets, moved by:
    assert q.forget_finished() == 2  # forget_finished
    assert q.refetch_due() == 0  # refetch_due (nothing due for a minute)
    assert q.unset_schedule(host="example.com")  # schedule_unset (EVAL)
    heartbeat(client, "sc", "node:1")  # heartbeat (EVAL)
    with short_lock(client, q.keys.lock("sweep"), 5) as got:  # unlock (EVAL)
        assert got

    pool = ProxyPool(client, "sc", PoolConfig(unban_by_time=False))  # checks run: proxies wait in new
    pid = pool.add("http://127.0.0.2:8001")  # add
    pool.add("http://127.0.0.3:8001", verify=True)
    pool.set_domain_rate("example.com", "3/30")  # domain_config
    pl = pool.acquire("example.com", worker="w1")  # acquire
    pool.release(pl, ok=True, latency_ms=10, status=200)  # release
    pool.reap()  # reap
    for proxy_id, *_ in pool.claim_for_check(limit=10, claim_seconds=5):  # health_claim
        pool.record_check(proxy_id, ok=True, latency_ms=5)  # health_result
    pool.ban(pid, seconds=60)  # ban
    pool.unban(pid)  # unban
    assert pool.remove(pid)  # remove
    # A finished URL without a schedule is remembered (a scheduled one's record is its dedup memory).
    plain = q.enqueue("https://example.org/plain", task="plain")
    q.complete(q.claim(plain, "w1"))
    report = Migration(client, "sc", "sc3", 3).run()  # migrate_in: records, remembered ids, items
    assert sum(report.tasks.values()) > 0 and report.remembered > 0 and report.items > 0
    gated = TaskQueue(client, "scg", lease_ttl=30, history_max=0, host_gate=True)
    for _ in gated.enqueue_many(["https://example.com/g", "https://example.org/g"]):
        gated.complete(gated.claim_next("w1"))
    assert Migration(client, "scg", "scg2", 2).run().carried == 2  # migrate_in: carried ids
    after = TaskQueue(client, "scg2", lease_ttl=30, host_gate=True, shards=2, dedup_ttl=0.001)
    assert after.forget_finished() == 2  # forget_carried


def test_every_script_touches_only_keys_of_its_routed_slot(cluster_url: str,
                                                           redis_cluster: RedisClusterGroup) -> None:
    names = every_script()
    monitor = Monitor(redis_cluster)
    try:
        _run_every_script(cluster_url)  # any CROSSSLOT or non-local key raises here
    finally:
        monitor.stop()
    assert not monitor.errors, monitor.errors
    calls = monitor.calls(names)
    assert {c.script for c in calls} >= set(names.values()), "scripts never run: " + ", ".join(
        sorted(set(names.values()) - {c.script for c in calls}))
    assert not [c.script for c in calls if c.script.startswith("unknown")]
    outside, computed = check_slots(calls, redis_cluster)
    assert not outside, "\n".join(sorted(set(outside)))
    # A key a script builds itself must be named at the top of that script, with the reason it is legal.
    undocumented = []
    for script, keys in sorted(computed.items()):
        folder, name = script.split("/")
        header = (PACKAGE / folder / f"{name}.lua").read_text().split("]]", 1)[0]
        names = {re.sub(r"^cha:\{[^}]*\}:(px:)?", "", key).split(":", 1)[0] for key in keys}
        missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", header))
        if "same slot" not in header.lower() or missing:
            undocumented.append(f"{script}: {missing or 'no same-slot note'}")
    assert not undocumented, "computed keys not documented in the header: " + "; ".join(undocumented)

def test_the_watch_sees_an_undeclared_key_redis_lets_through(cluster_url: str,
                                                            redis_cluster: RedisClusterGroup) -> None:
    """Redis 7 runs a script that writes an undeclared key of another slot on the same node; the MONITOR
    check above must catch exactly that."""
    client = redis_cluster.client()
    home = client.nodes_manager.get_node_from_slot(client.keyslot("{home}:k"))
    stray = next(f"{{stray{i}}}:k" for i in range(1000)
                 if client.keyslot(f"{{stray{i}}}:k") != client.keyslot("{home}:k")
                 and client.nodes_manager.get_node_from_slot(client.keyslot(f"{{stray{i}}}:k")) == home)
    source = "redis.call('SET', KEYS[1], 1); return redis.call('SET', ARGV[1], 1)"
    monitor = Monitor(redis_cluster)
    try:
        assert client.eval(source, 1, "{home}:k", stray)  # accepted by the server
    finally:
        monitor.stop()
    outside, _ = check_slots(monitor.calls({hashlib.sha1(source.encode()).hexdigest(): "bad"}), redis_cluster)
    assert outside == [f"bad: SET {stray!r} is not in slot {client.keyslot('{home}:k')}"]
