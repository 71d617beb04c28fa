"""Scrapy settings → celery-ha settings (environment wins), the Scrapy-only knobs, the start-up checks."""

from __future__ import annotations

import pytest

pytest.importorskip("scrapy")

from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings as ScrapySettings
from scrapy.utils.test import get_crawler

from celery_ha.base.errors import ConfigurationError
from celery_ha.contrib.scrapy import CeleryHAProxyMiddleware, CeleryHARetryMiddleware
from celery_ha.contrib.scrapy.config import (
    build_pool,
    celery_ha_settings,
    scrapy_knobs,
    worker_label,
)
from celery_ha.contrib.scrapy.wiring import check_wiring
from tests.contrib.scrapy.crawl import SNIPPET


def test_celery_ha_names_come_from_scrapy_settings_and_the_environment_wins() -> None:
    settings = ScrapySettings({
        "CELERY_HA_NAMESPACE": "shop",
        "CELERY_HA_PROXY_RATE": "2/10",
        "CELERY_HA_PROXY_DOMAIN_RATES": {"a.example": "1/5", "b.example": "3/60"},
        "CELERY_HA_DIRECT_WHEN_EMPTY": True,
        "BOT_NAME": "not ours",
    })
    cfg = celery_ha_settings(settings, env={})
    assert (cfg.namespace, cfg.proxy_rate, cfg.direct_when_empty) == ("shop", (2, 10.0), True)
    assert cfg.proxy_domain_rates == {"a.example": (1, 5.0), "b.example": (3, 60.0)}
    cfg = celery_ha_settings(settings, env={"CELERY_HA_NAMESPACE": "prod", "CELERY_HA_PROXY_RATE": "9/9"})
    assert (cfg.namespace, cfg.proxy_rate) == ("prod", (9, 9.0))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("CELERY_HA_NAMESPCE", "x", "unknown celery-ha setting"),
    ("CELERY_HA_PROXY_RATE", "fast", "CELERY_HA_PROXY_RATE"),
    ("CELERY_HA_NAMESPACE", {"a": 1}, "takes a string"),
])
def test_bad_celery_ha_settings_are_refused_by_name(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        celery_ha_settings(ScrapySettings({key: value}), env={})


def test_scrapy_only_knobs_parse_scrapy_style_values() -> None:
    knobs = scrapy_knobs(ScrapySettings({  # as `scrapy crawl -s NAME=VALUE` passes them: strings
        "CELERY_HA_SCRAPY_MAX_ROTATIONS": "3",
        "CELERY_HA_SCRAPY_BACKOFF_BASE": "0.25",
        "CELERY_HA_SCRAPY_PROXY_SLOTS": "False",
        "CELERY_HA_SCRAPY_CAPTCHA_MARKERS": "Solve This,robot-check",
        "CELERY_HA_SCRAPY_POOL": {"lock_ttl": 45, "max_fails": 2},
    }))
    assert (knobs.max_rotations, knobs.backoff_base, knobs.proxy_slots) == (3, 0.25, False)
    assert knobs.captcha_markers == ("solve this", "robot-check")
    assert dict(knobs.pool) == {"lock_ttl": 45, "max_fails": 2}
    assert scrapy_knobs(ScrapySettings()).max_rotations == 10
    label = worker_label(knobs, "books")
    assert label.startswith("scrapy:") and label.endswith(":books")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("CELERY_HA_SCRAPY_MAX_ROTATION", 3, "unknown Scrapy setting"),
    ("CELERY_HA_SCRAPY_MAX_ROTATIONS", "many", "is not a int"),
    ("CELERY_HA_SCRAPY_MAX_WAIT", -1, "between"),
    ("CELERY_HA_SCRAPY_ENABLED", "maybe", "boolean"),
    ("CELERY_HA_SCRAPY_POOL", {"rate": "1/1"}, "unknown pool option"),
    ("CELERY_HA_SCRAPY_WORKER", "\u00e9t\u00e9", "printable ASCII"),
])
def test_bad_scrapy_knobs_are_refused_by_name(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        scrapy_knobs(ScrapySettings({key: value}))


def test_pool_is_built_on_the_configured_redis_namespace_and_options(redis_url: str) -> None:
    settings = ScrapySettings({"CELERY_HA_SCRAPY_POOL": {"lock_ttl": 12}})
    cfg = celery_ha_settings(settings, env={"CELERY_HA_REDIS_URL": redis_url, "CELERY_HA_NAMESPACE": "ns1"})
    pool = build_pool(cfg, scrapy_knobs(settings))
    assert pool.namespace == "ns1" and pool.config.lock_ttl == 12
    assert pool.client.ping()
    bad = ScrapySettings({"CELERY_HA_SCRAPY_POOL": {"lock_ttl": -1}})
    with pytest.raises(ConfigurationError, match="CELERY_HA_SCRAPY_POOL"):
        build_pool(cfg, scrapy_knobs(bad))


def test_middlewares_follow_their_switches() -> None:
    with pytest.raises(NotConfigured):
        CeleryHAProxyMiddleware.from_crawler(get_crawler(Spider, {"CELERY_HA_SCRAPY_ENABLED": False}))
    with pytest.raises(NotConfigured):
        CeleryHARetryMiddleware.from_crawler(get_crawler(Spider, {"RETRY_ENABLED": False}))


def test_wiring_check_names_what_is_wrong() -> None:
    assert check_wiring(ScrapySettings(SNIPPET)) == []
    ours_only = {"celery_ha.contrib.scrapy.CeleryHAProxyMiddleware": 950}
    scrapy_retry_left_on = {"DOWNLOADER_MIDDLEWARES": ours_only}
    (warning,) = check_wiring(ScrapySettings(scrapy_retry_left_on))
    assert "Scrapy's RetryMiddleware is enabled" in warning
    too_early = {"DOWNLOADER_MIDDLEWARES": {**SNIPPET["DOWNLOADER_MIDDLEWARES"],
                                            "celery_ha.contrib.scrapy.CeleryHAProxyMiddleware": 800}}
    (warning,) = check_wiring(ScrapySettings(too_early))
    assert "HttpCacheMiddleware" in warning and "DownloaderStats" in warning
