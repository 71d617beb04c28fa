"""The dashboard in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``): the numbers
on the page are Redis' numbers, the page refreshes by itself, and an action clicked in the browser
changes Redis. Skipped, with the reason, where Chromium or Selenium is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ha.monitoring.auth import basic_header
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue
from celery_ha.state.pause import pause, resume
from tests.monitoring.webproc import web_process
from tests.support.cli import SECRET
from tests.support.polling import wait_until

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NS = "browser"
STATES = ("queued", "dispatched", "running", "delayed", "completed", "dead")

webdriver = pytest.importorskip("selenium.webdriver",
                                reason="selenium is not installed (pip install -e '.[dev]')")
if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
    pytest.skip("Debian's chromium and chromium-driver are not installed", allow_module_level=True)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1200",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _text(driver: webdriver.Chrome, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def _rows(driver: webdriver.Chrome, table: str) -> list[str]:
    """The rows' text in one script call (the page re-renders its tables on every refresh)."""
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{table} tbody tr')].map((r) => r.innerText)")


def _click_first(driver: webdriver.Chrome, selector: str) -> bool:
    """A real click on the first match; False when a refresh replaced it meanwhile (the caller polls)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        driver.find_element("css selector", selector).click()
        return True
    except StaleElementReferenceException:
        return False


def _shown(driver: webdriver.Chrome) -> dict[str, int]:
    return {s: int(_text(driver, f"count-{s}").replace(",", "") or -1) for s in STATES}


def test_the_page_shows_redis_numbers_refreshes_and_redrives(redis_url: str, browser, tmp_path: Path) -> None:
    q = TaskQueue.from_url(redis_url, NS)
    q.enqueue_many([f"https://example.com/case/{i}" for i in range(30)], task="fetch_page")
    for i in range(12):
        lease = q.claim_next("w1")
        if i % 4 == 0:
            q.fail(lease, "HTTP 404: gone", retry=False)
        else:
            q.complete(lease)
    pool = ProxyPool.from_url(redis_url, NS)
    pool.add_many(["http://127.0.0.2:8001", "http://127.0.0.3:8001"])
    pool.ban("127.0.0.3:8001", reason="blocked by test")
    with web_process(redis_url, NS, auth=("admin", SECRET)) as web:
        # basic auth the way a browser sends it after its login prompt, on every request of the page
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                                {"headers": {"Authorization": basic_header("admin", SECRET)}})
        browser.get(web.url + "/?interval=300")
        refreshes = lambda: int(browser.find_element("id", "updated").get_attribute("data-refreshes"))  # noqa: E731
        wait_until(lambda: refreshes() >= 1, timeout=20, what="the first refresh")
        stats = q.stats()
        assert _shown(browser) == {s: stats[s] for s in STATES}
        assert stats["dead"] == 3 and stats["completed"] == 9
        assert _text(browser, "progress-text").startswith("12 / 30 done")
        dead_rows = _rows(browser, "dead")
        assert len(dead_rows) == 3 and all("HTTP 404: gone" in row for row in dead_rows)
        proxies = _text(browser, "proxies")
        assert "blocked by test" in proxies and "127.0.0.2:8001" in proxies
        assert "fetch_page" in _text(browser, "latency")
        assert "actions enabled" in _text(browser, "mode")

        # Redis changes; the page follows by itself
        seen = refreshes()
        for _ in range(4):
            q.complete(q.claim_next("w2"))
        wait_until(lambda: _shown(browser)["completed"] == 13, timeout=20, what="the page to refresh")
        assert refreshes() > seen and _shown(browser)["queued"] == q.stats()["queued"] == 14

        # an action clicked in the browser: POST with the CSRF token, Redis changes, the page shows it
        wait_until(lambda: _click_first(browser, "#dead tbody tr button"), timeout=10, what="a click")
        wait_until(lambda: q.stats()["dead"] == 2, timeout=20, what="the redrive to reach Redis")
        wait_until(lambda: _shown(browser)["dead"] == 2, timeout=20, what="the page to show it")
        wait_until(lambda: _click_first(browser, "#proxies tbody tr button"), timeout=10, what="a click")
        wait_until(lambda: pool.get("127.0.0.3:8001").state == "avail", timeout=20, what="the unban")

        # a paused namespace says so on the page, and stops saying so once resumed
        assert _text(browser, "notices") == ""
        pause(q.client, NS, "site maintenance")
        wait_until(lambda: "site maintenance" in _text(browser, "notices"), timeout=20, what="the pause")
        resume(q.client, NS)
        wait_until(lambda: _text(browser, "notices") == "", timeout=20, what="the resume")
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if target := os.environ.get("DASHBOARD_SCREENSHOT"):  # refresh docs/dashboard.png on purpose
            shutil.copy(shot, target)


def test_a_bad_interval_falls_back_to_the_default_instead_of_polling_back_to_back(
        redis_url: str, browser) -> None:
    # Record the delay the page gives setInterval (setInterval(f, NaN) runs f back-to-back).
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        window.__delays = [];
        const real = window.setInterval;
        window.setInterval = (f, ms, ...rest) => {
          window.__delays.push(String(ms));
          return real(f, ms, ...rest);
        };
    """})
    with web_process(redis_url, NS) as web:
        for query, delay in (("?interval=x", "2000"), ("?interval=-5", "2000"),
                             ("?interval=Infinity", "2000"), ("?interval=100", "250"),
                             ("?interval=700", "700"), ("", "2000")):
            browser.get(web.url + "/" + query)
            delays = wait_until(lambda: browser.execute_script("return window.__delays"), timeout=20,
                                what="the page to start polling")
            assert delays == [delay], (query, delays)
