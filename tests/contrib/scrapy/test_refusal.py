"""A configuration error stops ``scrapy crawl`` at start: one line naming it, exit status 1, no
traceback, and not one request sent (the spider must never crawl without the pool). Real
``scrapy crawl`` runs of a small project, as a user starts them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from tests.contrib.scrapy.harness import ROOT
from tests.contrib.scrapy.sites import CaseSite

SETTINGS = '''
BOT_NAME = "shop"
SPIDER_MODULES = ["shop.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
DOWNLOADER_MIDDLEWARES = {
    "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
    "celery_ha.contrib.scrapy.CeleryHARetryMiddleware": 550,
    "celery_ha.contrib.scrapy.CeleryHAProxyMiddleware": 950,
}
CELERY_HA_NAMESPACE = "shop"
'''
SPIDER = '''
import os
import scrapy


class Pages(scrapy.Spider):
    name = "pages"
    start_urls = [os.environ["START_URL"]]

    def parse(self, response):
        self.logger.info("PAGE %s", response.status)
'''
NO_REDIS = ("no Redis configured: set CELERY_HA_REDIS_URL (e.g. redis://host:6379/0), or "
            "CELERY_HA_EMBEDDED=1 to use the local embedded Redis (development on one machine)")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = shop.settings\n", encoding="utf-8")
    package = tmp_path / "shop"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "settings.py").write_text(SETTINGS, encoding="utf-8")
    (package / "spiders" / "__init__.py").write_text(SPIDER, encoding="utf-8")
    return tmp_path


@pytest.fixture
def case_site() -> Iterator[CaseSite]:
    site = CaseSite().start()
    yield site
    site.stop()


def scrapy_crawl(project: Path, site: CaseSite, *options: str, **env: str) -> tuple[int, list[str]]:
    """``scrapy crawl pages`` in ``project`` with only the given celery-ha variables set: its exit
    status and every line it printed (Scrapy logs to stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_HA_")}
    clean.update({"PYTHONPATH": str(ROOT), "START_URL": site.url("/p/1"), **env})
    command = [sys.executable, "-m", "scrapy", "crawl", "pages", "-s", "LOG_LEVEL=INFO", *options]
    done = subprocess.run(command, cwd=project, env=clean, capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("options", "env", "message"), [
    ((), {}, NO_REDIS),
    (("-s", "CELERY_HA_NAMESPCE=x"), {"CELERY_HA_REDIS_URL": "redis://127.0.0.1:1/0"},
     "unknown celery-ha setting 'CELERY_HA_NAMESPCE'; known: ALLOW_EVICTION, "),
    (("-s", "CELERY_HA_SCRAPY_MAX_ROTATION=3"), {"CELERY_HA_REDIS_URL": "redis://127.0.0.1:1/0"},
     "unknown Scrapy setting 'CELERY_HA_SCRAPY_MAX_ROTATION'; known: CELERY_HA_SCRAPY_BACKOFF_BASE, "),
    (("-s", "CELERY_HA_SCRAPY_POOL=lock_ttl=30"), {"CELERY_HA_REDIS_URL": "redis://127.0.0.1:1/0"},
     "CELERY_HA_SCRAPY_POOL must be a dict of proxy pool options"),
    ((), {"CELERY_HA_REDIS_URL": "redis://u:Sekr3t@h:notaport/0"},
     "bad Redis URL 'redis://u:***@h:notaport/0': Port could not be cast"),
], ids=["no-redis", "misspelt-celery-ha-name", "misspelt-scrapy-knob", "pool-not-a-dict", "bad-redis-url"])
def test_a_configuration_error_stops_the_crawl_with_one_line(
    project: Path, case_site: CaseSite, options: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    status, lines = scrapy_crawl(project, case_site, *options, **env)
    ours = [line for line in lines if "celery-ha:" in line or "ConfigurationError" in line]
    assert len(ours) == 1, "\n".join(lines[-40:])
    assert f"[celery_ha.contrib.scrapy] ERROR: celery-ha: {message}" in ours[0]
    assert not any("Traceback" in line for line in lines), "\n".join(lines[-40:])
    assert status == 1
    assert case_site.visits == []  # stopped before any request: never crawled without the pool
    assert not any("Sekr3t" in line for line in lines)


@pytest.mark.timeout(60)
def test_the_same_project_crawls_when_configured(project: Path, case_site: CaseSite, redis_url: str) -> None:
    """The control: the project above is fine once the settings are (an empty pool, sent directly)."""
    status, lines = scrapy_crawl(project, case_site, CELERY_HA_REDIS_URL=redis_url,
                                 CELERY_HA_DIRECT_WHEN_EMPTY="1")
    assert status == 0, "\n".join(lines[-40:])
    assert [v.path for v in case_site.visits] == ["/p/1"]
    assert any("PAGE 200" in line for line in lines)
