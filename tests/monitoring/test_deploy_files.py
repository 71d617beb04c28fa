"""deploy/: the Grafana dashboard, the Prometheus config and alert rules, and the compose profile that
runs them. Schema-level checks always (every metric they name is one ``celery-ha web`` serves);
``promtool`` checks and unit-tests the rules too where it is installed (Debian's ``prometheus``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from celery_ha.monitoring.collector import Source, StateCollector
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "celery-ha.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
METRIC = re.compile(r"\bcelery_ha_[a-z_]+\b")
DURATION = re.compile(r"^\d+[smhd]$")
REQUIRED_ALERTS = {"CeleryHADeadLettersGrowing", "CeleryHANoProgress", "CeleryHANoWorkers",
                   "CeleryHAProxyPoolExhausted", "CeleryHALeaseLosses"}


@pytest.fixture
def served(r: redis.Redis, redis_url: str) -> set[str]:
    """Every sample name a scrape serves once a namespace has tasks, histograms and proxies."""
    q = TaskQueue.from_url(redis_url, "deploy")
    q.enqueue("https://example.com/1")
    q.complete(q.claim_next("w"))
    pool = ProxyPool.from_url(redis_url, "deploy")
    pool.add("http://127.0.0.2:8001")
    pool.release(pool.acquire("example.com"), ok=True, status=200)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(Source(r, "deploy", 30.0)))
    text = generate_latest(registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    return names | {"celery_ha_broker_messages"}  # served when the broker is Redis (test_scrape_after_crawl)


def test_grafana_dashboard_is_valid_and_names_only_served_metrics(served: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "celery-ha" and dash["schemaVersion"] >= 36
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 12
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["type"] in {"stat", "timeseries"} and panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["w"] > 0 and pos["h"] > 0
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                   for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, f"panel {panel['title']!r} overlaps another"
        cells |= covered
        assert panel["datasource"]["uid"] == uid and panel["targets"]
        for target in panel["targets"]:
            assert set(METRIC.findall(target["expr"])) <= served, target["expr"]
    assert dash["templating"]["list"][0]["name"] == "namespace"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/celery-ha.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_alert_rules_have_the_required_alerts_and_name_only_served_metrics(served: set[str]) -> None:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert REQUIRED_ALERTS <= {rule["alert"] for rule in rules}
    for rule in rules:
        assert set(METRIC.findall(rule["expr"])) <= served, rule["expr"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert DURATION.match(rule.get("for", "0s")), rule
        assert rule["expr"].count("(") == rule["expr"].count(")")
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["web:8808"]


def test_the_monitoring_profile_runs_web_prometheus_and_provisioned_grafana() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    monitoring = {name for name, spec in services.items() if "monitoring" in spec.get("profiles", [])}
    assert monitoring == {"web", "prometheus", "grafana"}
    # Beyond loopback celery-ha web needs a login or the explicit opt-out: the service adds
    # --insecure-no-auth only when CELERY_HA_WEB_AUTH is empty, and answers the Host name Prometheus
    # scrapes it by (test_web_hardening runs this command for real).
    assert " ".join(services["web"]["command"]) == \
        "celery-ha web --host 0.0.0.0 --port 8808 --allowed-hosts web"
    entrypoint = " ".join(services["web"]["entrypoint"])
    assert '[ -z "$${CELERY_HA_WEB_AUTH}" ]' in entrypoint and "--insecure-no-auth" in entrypoint
    assert "--insecure-no-auth" not in services["web"]["command"]
    for name in monitoring:
        for volume in services[name].get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), volume
        for port in services[name].get("ports", []):
            assert port.startswith("127.0.0.1:"), port  # published on loopback only
    assert "GRAFANA_ADMIN_PASSWORD" in " ".join(services["grafana"]["entrypoint"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_accepts_the_config_and_the_rules_pass_their_unit_tests() -> None:
    for args in (["check", "config", str(PROMETHEUS)], ["check", "rules", str(ALERTS)],
                 ["test", "rules", str(Path(__file__).with_name("alerts_promtool_test.yml"))]):
        out = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
