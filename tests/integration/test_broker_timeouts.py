"""Every connection to a Redis broker is bounded in time: kombu's (through the transport options the
app is configured with, which Celery's event and heartbeat publishing use too) and celery-ha's own
broker client. What a frozen broker then does to a running crawl is in
``tests/chaos/test_frozen_broker.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kombu import Connection

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.integration.dispatch.broker import broker_client, broker_timeout, kombu_broker

ROOT = Path(__file__).resolve().parents[2]
SENTINELS = "sentinel://:pw@127.0.0.1:26379;sentinel://127.0.0.1:26380/1"
BOUNDS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")


@pytest.mark.parametrize(("ttl", "expected"), [("30", 5.0), ("3", 1.0), ("12", 2.0), ("600", 5.0)])
def test_the_broker_timeout_is_a_sixth_of_the_lease_ttl_within_one_to_five_seconds(ttl: str,
                                                                                   expected: float) -> None:
    settings = Settings.from_env({"CELERY_HA_LEASE_TTL": ttl, "CELERY_HA_HEARTBEAT_INTERVAL": "0.5"})
    assert broker_timeout(settings) == expected


def test_the_broker_timeout_setting_wins_and_is_checked() -> None:
    settings = Settings.from_env({"CELERY_HA_BROKER_TIMEOUT": "0.5"})
    assert broker_timeout(settings) == 0.5
    assert Settings.from_overrides({"BROKER_TIMEOUT": 7}, env={}).broker_timeout == 7.0
    with pytest.raises(ConfigurationError, match="CELERY_HA_BROKER_TIMEOUT"):
        Settings.from_env({"CELERY_HA_BROKER_TIMEOUT": "never"})


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6390/2", "rediss://u:p@127.0.0.1:6390/0",
                                 "unix:///tmp/redis.sock"])
def test_a_redis_broker_gets_the_timeouts_as_transport_options(url: str) -> None:
    broker = kombu_broker(url, Settings.from_env({"CELERY_HA_BROKER_TIMEOUT": "2"}))
    assert broker.url == url
    assert {k: broker.transport_options[k] for k in BOUNDS} == dict.fromkeys(BOUNDS, 2.0)


def test_a_sentinel_broker_bounds_the_master_and_the_sentinels() -> None:
    settings = Settings.from_env({"CELERY_HA_SENTINEL_MASTER": "mymaster", "CELERY_HA_LEASE_TTL": "12"})
    options = kombu_broker(SENTINELS, settings).transport_options
    assert options["master_name"] == "mymaster"
    assert {k: options[k] for k in BOUNDS} == dict.fromkeys(BOUNDS, 2.0)
    assert options["sentinel_kwargs"] == {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


def test_an_amqp_broker_is_left_alone() -> None:
    broker = kombu_broker("amqp://guest:guest@127.0.0.1:5672//", Settings())
    assert broker.transport_options == {} and broker.use_ssl is None


def test_kombus_redis_channel_takes_the_timeouts(redis_url: str) -> None:
    """The option names are kombu's own: its channel reads them into its connection parameters."""
    broker = kombu_broker(redis_url, Settings.from_env({"CELERY_HA_BROKER_TIMEOUT": "1.5"}))
    with Connection(broker.url, transport_options=broker.transport_options) as conn:
        params = conn.default_channel._connparams()
    # kombu drops health_check_interval when it cannot see the argument in the connection class's
    # signature: kombu 5.6 (the floor) does so with redis-py 7's classes; the timeouts always pass.
    assert params["socket_timeout"] == params["socket_connect_timeout"] == 1.5
    assert params.get("health_check_interval", 1.5) == 1.5


def test_celery_ha_s_own_broker_client_is_bounded_like_kombu() -> None:
    app = SimpleNamespace(conf=SimpleNamespace(broker_url="redis://127.0.0.1:6390/7",
                                               broker_transport_options={"socket_timeout": 1.25}))
    client = broker_client(app, Settings.from_env({"CELERY_HA_BROKER_TIMEOUT": "3"}))
    assert client is not None
    kwargs = client.connection_pool.connection_kwargs
    # the app's own option wins; what it does not set comes from the settings
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["health_check_interval"]) == \
        (1.25, 3.0, 3.0)


def test_the_celery_app_carries_the_timeouts() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_HA_", "CELERY_BROKER"))}
    env.update({"CELERY_HA_REDIS_URL": "redis://127.0.0.1:1/0", "CELERY_BROKER_URL": "redis://127.0.0.1:2/3",
                "CELERY_HA_LEASE_TTL": "18", "PYTHONPATH": str(ROOT)})
    code = ("import celery_ha; o = celery_ha.app.conf.broker_transport_options; "
            "print(o['socket_timeout'], o['socket_connect_timeout'], o['health_check_interval'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3.0", "3.0", "3.0"]
