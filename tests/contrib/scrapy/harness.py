"""Start real Scrapy crawls (``tests/contrib/scrapy/crawl.py``) as processes and collect what they leave.

The proxies are the product's farm (``celery_ha.demo.proxy_farm`` via ``tests.support.proxy_farm``),
the site is the demo's (``celery_ha.demo.site.DemoSite``): both log what they served, which is what
the tests assert on, besides Redis.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from celery_ha.proxy import PoolConfig, ProxyPool
from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]
#: Proxy credentials the crawls use; the tests grep every log for them.
USER, PASSWORD = "scrapy-user", "pw-Sekr3t-91f"


def secrets() -> list[str]:
    """What must never appear in a log: the password and the Basic header built from it."""
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return [PASSWORD, token]


@dataclass
class Crawl:
    """One finished crawl process."""

    output: dict[str, Any]
    log: str  # the Scrapy log file plus the process' stdout and stderr
    returncode: int

    @property
    def stats(self) -> dict[str, Any]:
        return self.output["stats"]

    def stat(self, name: str) -> int:
        return int(self.stats.get(name, 0))

    def released(self) -> int:
        """Every lease this crawl returned, whatever the outcome."""
        prefix = "celery_ha/proxy/released/"
        return sum(int(v) for k, v in self.stats.items() if k.startswith(prefix))


def pool_for(redis_url: str, namespace: str, **config: Any) -> ProxyPool:
    return ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), namespace, PoolConfig(**config))


def crawl_env(redis_url: str, namespace: str, rate: str, **extra: str) -> dict[str, str]:
    """The environment of a crawl process: celery-ha's variables, nothing inherited of them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_HA_")}
    env.update({"CELERY_HA_REDIS_URL": redis_url, "CELERY_HA_NAMESPACE": namespace,
                "CELERY_HA_PROXY_RATE": rate, "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


def run_crawls(tmp_path: Path, env: dict[str, str], configs: list[dict[str, Any]],
               timeout: float = 90.0) -> list[Crawl]:
    """Run one process per config at the same time; wait for all (SIGKILL on timeout). A config's
    ``env`` entries are added to ``env`` for that process only."""
    procs = []
    for i, config in enumerate(configs):
        cfg = dict(config)
        extra_env = cfg.pop("env", {})
        cfg["out"] = str(tmp_path / f"out-{i}.json")
        settings = dict(cfg.get("settings", {}))
        settings["LOG_FILE"] = str(tmp_path / f"crawl-{i}.log")
        cfg["settings"] = settings
        path = tmp_path / f"config-{i}.json"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        out = open(tmp_path / f"stdout-{i}.txt", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "tests.contrib.scrapy.crawl", str(path)],
                                cwd=ROOT, env={**env, **extra_env}, stdout=out,
                                stderr=subprocess.STDOUT)
        procs.append((proc, out, cfg))
    deadline = time.monotonic() + timeout
    try:
        wait_until(lambda: all(p.poll() is not None for p, _, _ in procs), timeout=timeout,
                   interval=0.1, what="the Scrapy crawls to finish")
    finally:
        for proc, out, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(max(1.0, deadline - time.monotonic()))
            out.close()
    crawls = []
    for i, (proc, _, cfg) in enumerate(procs):
        log = (tmp_path / f"crawl-{i}.log").read_text(encoding="utf-8", errors="replace")
        log += (tmp_path / f"stdout-{i}.txt").read_text(encoding="utf-8", errors="replace")
        out_path = Path(cfg["out"])
        assert out_path.exists(), f"crawl {i} wrote no output (exit {proc.returncode}):\n{log[-3000:]}"
        crawls.append(Crawl(json.loads(out_path.read_text(encoding="utf-8")), log, proc.returncode))
    return crawls


def assert_every_lease_returned(pool: ProxyPool, crawls: list[Crawl]) -> dict[str, int]:
    """Exactly once per acquire: each crawl returned what it borrowed, and the pool agrees — no lease
    open, none left to expire or be reaped, as many releases recorded as the crawls borrowed."""
    for c in crawls:
        assert c.stat("celery_ha/proxy/acquired") == c.released(), c.stats
        assert c.stat("celery_ha/proxy/release_failed") == 0
    stats = pool.stats()
    assert stats["in_use"] == 0, stats
    assert stats.get("reaped", 0) == 0, stats
    assert pool.client.keys(pool.prefix + "lk:*") == []
    recorded = sum(v for k, v in stats.items() if k.startswith("out_"))
    assert recorded == sum(c.stat("celery_ha/proxy/acquired") for c in crawls), stats
    return stats


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in secrets():
            assert secret not in text, "a proxy credential reached a log"
