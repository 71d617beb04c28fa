"""verify=True on a pool where no health check will ever run (CELERY_HA_PROXY_CHECK_URL unset).

Such a proxy used to wait in the 'new' zone forever, so a crawl given only free-list or verified
proxies stalled on "no proxy available (empty)" without a word. The pool knows no check runs (the
same ``PoolConfig.unban_by_time`` that ends temporary bans by time), so its housekeeping admits the
waiting proxies unchecked, and the add warns once. Each test asserts on the Redis zones and on what
``acquire`` hands out; waits poll the Redis clock.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.proxy import FreeListProvider, ProxyPool, parse_proxy_url
from tests.proxy.test_pool_lifecycle import make_pool, redis_ms
from tests.support.polling import wait_until

P = "cha:{default}:px:"
CHECK_URL = "http://check.example/"


@pytest.fixture(autouse=True)
def no_check_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default deployment: no check URL (a test that needs one sets it)."""
    monkeypatch.delenv("CELERY_HA_PROXY_CHECK_URL", raising=False)



def handed_out(pool: ProxyPool, domain: str, n: int) -> list[str]:
    """What ``n`` acquires for ``domain`` hand out, leases kept (each locks its proxy × domain): a
    proxy id per grant, ``none:<reason>`` per refusal."""
    out = []
    for _ in range(n):
        try:
            out.append(pool.acquire(domain).proxy_id)
        except NoProxyAvailable as exc:
            out.append(f"none:{exc.reason}")  # type: ignore[attr-defined]
    return out


def test_verified_proxies_join_rotation_at_the_next_acquire_when_no_check_url_is_set(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    pool = make_pool(redis_url)
    assert pool.config.unban_by_time is True  # what "no check will ever run" is known by
    one = pool.add("http://127.0.0.3:8001", verify=True)
    assert pool.add_many(["http://127.0.0.4:8001", "http://127.0.0.5:8001"], verify=True)["added"] == 2
    assert pool.add_specs([parse_proxy_url("http://127.0.0.6:8001")], verify=True)["added"] == 1
    listing = tmp_path / "free.txt"
    listing.write_text("127.0.0.7:8080 3h\n")
    assert FreeListProvider(str(listing)).install(pool)["added"] == 1  # a provider adding with verify
    ids = {one, "127.0.0.4:8001", "127.0.0.5:8001", "127.0.0.6:8001", "127.0.0.7:8080"}
    assert set(r.zrange(P + "new", 0, -1)) == ids and r.zcard(P + "av") == 0  # visible as waiting

    assert sorted(handed_out(pool, "x.example", 6)) == [*sorted(ids), "none:busy"]
    assert r.zcard(P + "new") == 0 and set(r.zrange(P + "av", 0, -1)) == ids
    assert {r.hget(P + "m:" + pid, "state") for pid in ids} == {"avail"}
    assert pool.stats()["admitted_unchecked"] == 5 and pool.stats()["new"] == 0


def test_proxies_stuck_in_new_are_admitted_by_reap_and_wait_where_checks_run(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_HA_PROXY_CHECK_URL", CHECK_URL)
    checked = make_pool(redis_url)  # a pool whose beat runs checks: verify keeps its meaning
    assert checked.config.unban_by_time is False
    pid = checked.add("http://127.0.0.3:8001", verify=True)
    assert handed_out(checked, "x.example", 1) == ["none:empty"]
    checked.reap()
    assert r.zrange(P + "new", 0, -1) == [pid] and r.zcard(P + "av") == 0

    monkeypatch.delenv("CELERY_HA_PROXY_CHECK_URL")
    unchecked = make_pool(redis_url)  # the same pool where no check runs (or proxies left by old code)
    unchecked.reap()
    assert r.zcard(P + "new") == 0 and r.zrange(P + "av", 0, -1) == [pid]
    assert r.hget(P + "m:" + pid, "state") == "avail"
    assert handed_out(unchecked, "x.example", 1) == [pid]


def test_a_claimed_new_proxy_waits_for_its_probe_then_is_admitted(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    pid = pool.add("http://127.0.0.3:8001", verify=True)
    [(claimed, _url, zone, _source, claim)] = pool.claim_for_check(limit=10, claim_seconds=0.5)
    assert (claimed, zone) == (pid, "new")
    # A manual `proxies check --url` holds it: the probe, not the housekeeping, decides for now.
    assert handed_out(pool, "x.example", 1) == ["none:empty"]
    assert r.zrange(P + "new", 0, -1) == [pid]
    until = int(r.zscore(P + "new", pid) or 0)
    wait_until(lambda: redis_ms(r) > until, what="the health claim to run out")
    assert handed_out(pool, "x.example", 1) == [pid]  # the claim ran out: admitted unchecked
    assert pool.record_check(pid, False, 100, claim) == "skip"  # a late probe does not undo it
    assert r.zrange(P + "av", 0, -1) == [pid] and r.zcard(P + "tb") == 0


def test_verify_without_a_check_warns_once_naming_the_check_url(
    redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_ha.proxy")
    pool = make_pool(redis_url)
    pool.add("http://127.0.0.2:8001")  # no verify: nothing to say
    assert caplog.records == []
    pool.add_many(["http://127.0.0.3:8001", "http://127.0.0.4:8001"], verify=True)
    pool.add("http://127.0.0.5:8001", verify=True)
    pool.add("http://127.0.0.3:8001", verify=True)  # an update
    assert len(caplog.records) == 1, caplog.text  # once, not once per add
    record = caplog.records[0]
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert message.startswith("proxy add: 2 proxy(ies) added with verify=True join rotation unchecked")
    assert "CELERY_HA_PROXY_CHECK_URL" in message
    assert r.zcard(P + "new") == 3  # the warning is about what happens next, nothing is refused

    caplog.clear()
    monkeypatch.setenv("CELERY_HA_PROXY_CHECK_URL", CHECK_URL)
    make_pool(redis_url).add("http://127.0.0.6:8001", verify=True)  # a check will run: no warning
    assert caplog.records == [] and r.zscore(P + "new", "127.0.0.6:8001") is not None
