"""Settings: environment first, Django settings as the fallback, one clear error for a bad value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings


def test_defaults_and_overrides() -> None:
    s = Settings.from_env({})
    assert (s.namespace, s.lease_ttl, s.heartbeat_interval, s.max_attempts, s.proxy_rate) == (
        "default", 30.0, 5.0, 3, (5, 60.0))
    s = Settings.from_env({"CELERY_HA_NAMESPACE": "shop", "CELERY_HA_PROXY_RATE": "2/10",
                           "CELERY_HA_OBEY_ROBOTS": "no"})
    assert (s.namespace, s.proxy_rate, s.obey_robots) == ("shop", (2, 10.0), False)


@pytest.mark.parametrize(("env", "needle"), [
    ({"CELERY_HA_LEASE_TTL": "soon"}, "CELERY_HA_LEASE_TTL"),
    ({"CELERY_HA_MAX_ATTEMPTS": "0"}, "CELERY_HA_MAX_ATTEMPTS"),
    ({"CELERY_HA_NAMESPACE": "a b"}, "CELERY_HA_NAMESPACE"),
    ({"CELERY_HA_PROXY_RATE": "fast"}, "CELERY_HA_PROXY_RATE"),
    ({"CELERY_HA_OBEY_ROBOTS": "maybe"}, "CELERY_HA_OBEY_ROBOTS"),
    ({"CELERY_HA_LEASE_TTL": "5", "CELERY_HA_HEARTBEAT_INTERVAL": "5"}, "CELERY_HA_HEARTBEAT_INTERVAL"),
    ({"CELERY_HA_REDIS_URL": "http://x"}, "CELERY_HA_REDIS_URL='http://x': use one of redis://"),
    ({"CELERY_HA_REDIS_URL": "redis://:pw@h:6379/abc"}, r"CELERY_HA_REDIS_URL=.*\*\*\*.*must be a number"),
])
def test_bad_values_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        Settings.from_env(env)


def test_several_namespaces_the_first_is_the_process_own() -> None:
    s = Settings.from_env({"CELERY_HA_NAMESPACES": "shop, news,shop"})
    assert (s.namespace, s.namespaces, s.served_namespaces) == ("shop", ("shop", "news"), ("shop", "news"))
    s = Settings.from_env({"CELERY_HA_NAMESPACES": "shop,news", "CELERY_HA_NAMESPACE": "news"})
    assert (s.namespace, s.served_namespaces) == ("news", ("news", "shop"))
    assert Settings.from_env({}).served_namespaces == ("default",)
    with pytest.raises(ConfigurationError, match="NAMESPACE=blog is not one of CELERY_HA_NAMESPACES"):
        Settings.from_env({"CELERY_HA_NAMESPACES": "shop,news", "CELERY_HA_NAMESPACE": "blog"})
    with pytest.raises(ConfigurationError, match="CELERY_HA_NAMESPACES"):
        Settings.from_env({"CELERY_HA_NAMESPACES": "shop,no good"})
    # A framework's configuration may give a list (Django's CELERY_HA = {"NAMESPACES": [...]}).
    s = Settings.from_overrides({"NAMESPACES": ["shop", "news"]}, env={})
    assert s.served_namespaces == ("shop", "news")


def test_namespace_patterns_serve_the_matches_beside_the_names() -> None:
    s = Settings.from_env({"CELERY_HA_NAMESPACES": "shop, crawl-*, news-?"})
    assert (s.namespace, s.served_namespaces) == ("shop", ("shop",))
    assert s.namespace_patterns == ("crawl-*", "news-?")
    assert s.serves("shop") and s.serves("crawl-a") and s.serves("news-1")
    assert not s.serves("news-12") and not s.serves("blog") and not s.serves("Crawl-a")
    # Patterns only: the process's own namespace is CELERY_HA_NAMESPACE (default "default"), served too.
    assert Settings.from_env({"CELERY_HA_NAMESPACES": "*"}).served_namespaces == ("default",)
    s = Settings.from_env({"CELERY_HA_NAMESPACES": "shop,crawl-*", "CELERY_HA_NAMESPACE": "crawl-x"})
    assert (s.namespace, s.served_namespaces) == ("crawl-x", ("crawl-x", "shop"))
    with pytest.raises(ConfigurationError, match="NAMESPACE=blog is not one of CELERY_HA_NAMESPACES"):
        Settings.from_env({"CELERY_HA_NAMESPACES": "shop,crawl-*", "CELERY_HA_NAMESPACE": "blog"})
    with pytest.raises(ConfigurationError, match=r"CELERY_HA_NAMESPACES: pattern 'crawl/\*' may hold only"):
        Settings.from_env({"CELERY_HA_NAMESPACES": "crawl/*"})
    assert Settings.from_env({"CELERY_HA_DISCOVERY_INTERVAL": "0.5"}).discovery_interval == 0.5


def test_django_settings_are_the_fallback() -> None:
    pytest.importorskip("django")
    code = (
        "from django.conf import settings\n"
        "settings.configure(CELERY_HA_NAMESPACE='from-django', CELERY_HA_LEASE_TTL=12)\n"
        "from celery_ha.base.settings import Settings\n"
        "s = Settings.from_env()\n"
        "print(s.namespace, s.lease_ttl)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "CELERY_HA_LEASE_TTL": "20"}  # the environment wins over Django
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["from-django", "20.0"]


def test_chains_are_on_unless_a_pattern_names_the_namespaces_or_they_are_set() -> None:
    assert Settings.from_env({}).chain_seconds == 1.0
    assert Settings.from_env({"CELERY_HA_NAMESPACES": "shop,news"}).chain_seconds == 1.0
    assert Settings.from_env({"CELERY_HA_NAMESPACES": "shop,crawl-*"}).chain_seconds == 0.0
    both = {"CELERY_HA_NAMESPACES": "crawl-*", "CELERY_HA_CHAIN": "2.5"}
    assert Settings.from_env(both).chain_seconds == 2.5
    assert Settings.from_env({"CELERY_HA_CHAIN": "0"}).chain_seconds == 0.0
    for bad in ("-1", "soon", "61"):
        with pytest.raises(ConfigurationError, match="CELERY_HA_CHAIN"):
            Settings.from_env({"CELERY_HA_CHAIN": bad})


def test_batch_sizes_per_task_name() -> None:
    s = Settings.from_env({"CELERY_HA_BATCH": "bench_noop=50, *=5"})
    assert (s.batch_size("bench_noop"), s.batch_size("fetch_page"), s.largest_batch) == (50, 5, 50)
    assert Settings.from_env({}).batch_size("fetch_page") == 1
    for bad in ("0", "fetch_page=x", "bad name=3", "2000", "fetch\x00page=3"):
        with pytest.raises(ConfigurationError, match="CELERY_HA_BATCH"):
            Settings.from_env({"CELERY_HA_BATCH": bad})
