"""What a migration leaves behind (``celery-ha migrate``): no task of the old namespace starts there
again (a claim from a message still in its broker queue, a resume), one migration of a source at a
time (two operators at their prompts), the new namespace registered, a finished migration run again
exits 0, and one ``celery-ha web`` reads namespaces of several shard counts."""

from __future__ import annotations

import os
import pty
import select
import sys
import time

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.base.errors import ConfigurationError
from celery_ha.state.keys import QueueKeys
from celery_ha.state.migrate import Migration
from celery_ha.state.namespaces import registered, servable_matches
from celery_ha.state.pause import paused
from celery_ha.state.purge import purge_namespace
from celery_ha.state.shards import namespace_keys
from celery_ha.state.worker_registry import heartbeat
from tests.monitoring.webproc import web_process
from tests.support.cli import assert_one_line_error, run


def _cli(redis_url: str, namespace: str, *args: str) -> list[str]:
    return ["--redis-url", redis_url, "-n", namespace, *args]


def _source(redis_url: str, tasks: int = 40) -> tuple[TaskQueue, list[str]]:
    """Namespace src (2 shards): ``tasks`` tasks, 6 of them dispatched (their messages in the broker)."""
    q = TaskQueue.from_url(redis_url, "src", lease_ttl=30, shards=2)
    q.enqueue_many([f"http://h{i % 4}.example/p/{i}" for i in range(tasks)])
    return q, [d.task_id for d in q.dispatch(6)]


class _ClaimedMeanwhile(Migration):
    """A migration during which the source's messages arrive: a claim of each dispatched task between
    two pages the migration reads (what a worker still consuming the source's queue does)."""

    def __init__(self, src: TaskQueue, ids: list[str], *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.worker, self.dispatched, self.leases = src, ids, []

    def _import_page(self, page: list, k: QueueKeys) -> None:  # type: ignore[type-arg]
        self.leases += [lease for tid in self.dispatched if (lease := self.worker.claim(tid, "late@node:1"))]
        super()._import_page(page, k)


def test_no_message_of_a_migrating_or_migrated_source_starts_a_task_there(
        redis_url: str, r: redis.Redis) -> None:
    src, dispatched = _source(redis_url)
    migration = _ClaimedMeanwhile(src, dispatched, r, "src", "dst", 3)
    report = migration.run()
    assert migration.leases == [] and report.unseen == 0  # refused while it ran: the source did not change
    for tid in dispatched:  # and after: the message is dropped, the record stays as the migration read it
        assert src.claim(tid, "late@node:2") is None and src.claim(tid, "late@node:2", adopt=True) is None
        assert src.get(tid).state == "dispatched"
    assert src.stats()["claimed"] == 0
    dst = TaskQueue.from_url(redis_url, "dst", shards=3)
    leases = [dst.claim(tid, "new@node:1") for tid in dispatched]  # each runs once, in the target
    assert all(leases) and dst.stats()["queued"] == 40 - 6


def test_resume_refuses_a_migrated_or_migrating_source_and_reopens_an_abandoned_one(
        redis_url: str, r: redis.Redis) -> None:
    src, dispatched = _source(redis_url, tasks=3000)

    more = iter(range(7, 10_000))  # six are dispatched already: the window grows by one a page

    class _WorkedOn(Migration):  # a pump not yet paused dispatches meanwhile: the migration stays open
        def _import_page(self, page: list, k: QueueKeys) -> None:  # type: ignore[type-arg]
            src.dispatch(next(more))
            super()._import_page(page, k)

    assert _WorkedOn(r, "src", "dst", 3).run().unseen > 0
    assert_one_line_error(run(_cli(redis_url, "src", "resume")), code=1,
                          contains="namespace 'src' is being migrated to 'dst': finish that migration")
    assert paused(r, "src") is not None

    purge_namespace(r, "dst")  # abandoned: the old namespace is the crawl again
    resumed = run(_cli(redis_url, "src", "resume"))
    assert resumed.exit_code == 0 and "namespace src resumed" in resumed.output, resumed.output
    assert paused(r, "src") is None and r.hget("cha:{src}:meta", "migrating_to") is None
    assert src.claim(dispatched[0], "w@node:1") is not None  # its claims are taken again

    assert Migration(r, "src", "dst2", 2).run().unseen == 0
    refused = run(_cli(redis_url, "src", "resume"))
    assert_one_line_error(refused, code=1, contains="namespace 'src' was migrated to 'dst2'")
    assert paused(r, "src") is not None and src.claim(dispatched[1], "w@node:1") is None


def test_two_migrations_of_one_source_into_two_targets_one_is_refused(redis_url: str, r: redis.Redis) -> None:
    """Both passed check() (two operators at their prompts); the one that runs second is refused,
    whether the first is still running or done, and leaves nothing in its target."""
    _source(redis_url, tasks=1200)
    first, second, third = (Migration(r, "src", name, 2) for name in ("one", "two", "three"))
    for m in (first, second, third):
        m.check(lease_ttl=30)
    refusals: list[str] = []

    class _Racing(Migration):
        def _import_page(self, page: list, k: QueueKeys) -> None:  # type: ignore[type-arg]
            if not refusals:
                with pytest.raises(ConfigurationError) as exc:
                    second.run()
                refusals.append(str(exc.value))
            super()._import_page(page, k)

    assert _Racing(r, "src", "one", 2).run().unseen == 0
    assert refusals == ["namespace 'src' is being migrated to 'one': finish that migration (run it again) "
                        "or purge 'one' first"]
    with pytest.raises(ConfigurationError, match="'src' was migrated to 'one' already"):
        third.run()
    for loser in ("two", "three"):
        assert not any(r.exists(*(key for key in (k.meta, k.record_geometry, k.ready_bands)))
                       for k in namespace_keys(r, loser)), loser
    assert r.hmget("cha:{src}:meta", ["migrated_to", "migrating_to"]) == ["one", None]
    assert r.hget("cha:{one}:meta", "migrated_from") == "src"


def _spawn(redis_url: str, target: str) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: an operator's interactive `celery-ha migrate`
        args = _cli(redis_url, "src", "migrate", target, "--shards", "2")
        os.execv(sys.executable, [sys.executable, "-m", "celery_ha.cli", *args])
    return pid, fd


def _read_until(fd: int, needle: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        assert time.monotonic() < deadline, seen
        if select.select([fd], [], [], 0.2)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


def _finish(pid: int, fd: int) -> tuple[int, str]:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_two_operators_answering_yes_at_once_migrate_the_source_once(redis_url: str, r: redis.Redis) -> None:
    _source(redis_url, tasks=3000)
    a, b = _spawn(redis_url, "shop-a"), _spawn(redis_url, "shop-b")
    for _pid, fd in (a, b):
        _read_until(fd, b"[y/N]")
    os.write(a[1], b"y\n")
    os.write(b[1], b"y\n")
    results = {name: _finish(*proc) for name, proc in (("shop-a", a), ("shop-b", b))}
    won = [name for name, (code, _) in results.items() if code == 0]
    assert len(won) == 1, results
    lost = "shop-b" if won == ["shop-a"] else "shop-a"
    code, out = results[lost]
    assert code == 1 and "namespace 'src' " in out and "Traceback" not in out, out
    assert r.hget("cha:{src}:meta", "migrated_to") == won[0]
    assert not r.exists("cha:{" + lost + "}:meta") and TaskQueue.from_url(redis_url, lost, shards=2).stats()[
        "queued"] == 0


def test_a_worker_that_appears_while_the_operator_reads_the_prompt_stops_the_migration(
        redis_url: str, r: redis.Redis) -> None:
    _source(redis_url)
    pid, fd = _spawn(redis_url, "dst")
    _read_until(fd, b"[y/N]")
    heartbeat(r, "src", "node-1@host:4242")  # a worker of the source started meanwhile
    os.write(fd, b"y\n")
    code, out = _finish(pid, fd)
    assert code == 1 and "stop the workers of 'src' first" in out, out
    assert not r.exists("cha:{dst}:meta") and paused(r, "src") is None


def test_the_target_is_registered_and_a_pattern_serves_it_not_the_source(
        redis_url: str, r: redis.Redis) -> None:
    shop = TaskQueue.from_url(redis_url, "crawl-shop", shards=2)
    shop.enqueue_many([f"http://a.example/{i}" for i in range(9)])
    assert registered(r) == ["crawl-shop"]
    done = run(_cli(redis_url, "crawl-shop", "migrate", "crawl-shop2", "--shards", "2", "--yes"))
    assert done.exit_code == 0, done.output
    assert registered(r) == ["crawl-shop", "crawl-shop2"]
    fit, refused = servable_matches(r, ("crawl-*",), (), 2)
    assert fit == ["crawl-shop2"], (fit, refused)
    assert "moved (or is moving) namespace 'crawl-shop' to 'crawl-shop2'" in refused["crawl-shop"]
    # A reader (celery-ha web) still shows the old one.
    assert servable_matches(r, ("crawl-*",), (), 2, moved_away=True)[0] == ["crawl-shop", "crawl-shop2"]


def test_a_finished_migration_run_again_says_so_and_exits_0(redis_url: str, r: redis.Redis) -> None:
    _source(redis_url)
    args = _cli(redis_url, "src", "migrate", "dst", "--shards", "3", "--yes")
    assert run(args).exit_code == 0
    # What a release before the claim marks and the registration left: the same command seals it.
    r.srem("cha:namespaces", "dst")
    for k in namespace_keys(r, "src"):
        r.hdel(k.record_geometry, "mv")
    again = run(args)
    assert again.exit_code == 0, again.output
    said = "namespace src was migrated into dst already: nothing to do"
    assert again.output.strip().splitlines()[-1] == said
    assert "dst" in registered(r) and all(r.hget(k.record_geometry, "mv") == "dst"
                                          for k in namespace_keys(r, "src"))
    as_json = run([*args, "--json"])
    assert as_json.exit_code == 0 and '"already_migrated": true' in as_json.output
    assert TaskQueue.from_url(redis_url, "dst", shards=3).stats()["queued"] == 40


def test_one_web_reads_a_migrated_target_of_three_shards_beside_a_namespace_of_one(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_HA_SHARDS", raising=False)
    TaskQueue.from_url(redis_url, "shop").enqueue_many([f"https://s.example/{i}" for i in range(30)])
    assert Migration(r, "shop", "shop2", 3).run().unseen == 0
    TaskQueue.from_url(redis_url, "news").enqueue_many([f"https://n.example/{i}" for i in range(7)])
    with web_process(redis_url, "ignored", "--namespaces", "shop2,news") as web:
        for ns, queued in (("shop2", 30), ("news", 7)):
            stats = web.get(f"/api/stats?namespace={ns}")
            assert stats.status == 200, (ns, stats.status, stats.text[:300])
            assert (stats.json()["namespace"], stats.json()["queued"]) == (ns, queued)
        assert web.get("/?namespace=shop2").status == 200
