"""docker-compose.yml: the default stack and the "ha" profile (master, replica, three sentinels)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from celery_ha.base.settings import Settings
from celery_ha.redisio.sentinel import parse_sentinel_url

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def interpolated(value: str) -> str:
    """Compose's ``${VAR:-default}`` with nothing set: the default (``$$`` is a literal ``$``)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value).replace("$$", "$")


APP_SERVICES = ("worker", "beat", "flower", "web", "worker-ha", "beat-ha")


def test_production_shape(services: dict) -> None:
    for name in APP_SERVICES:
        spec = services[name]
        assert spec["image"] == "celery-ha:latest" and spec["build"] == ".", name
        assert isinstance(spec["command"], list), f"{name}: exec form, so tini hands SIGTERM to Celery"
        assert "pip install" not in " ".join(spec["command"]), name  # installed at build time
        assert spec["restart"] == "unless-stopped", name
        grace = int(spec["stop_grace_period"].rstrip("s"))
        soft = float(spec["environment"]["CELERY_HA_SOFT_SHUTDOWN_TIMEOUT"])
        assert grace > soft + 20, f"{name}: stop_grace_period must outlast the soft shutdown"
    redis = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis and "--maxmemory-policy noeviction" in redis
    for name in ("redis", "worker", "flower", "web", "redis-master", "sentinel-1"):
        assert services[name]["healthcheck"]["test"], name
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "pong" in " ".join(services["worker"]["healthcheck"]["test"])
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    assert services["worker"]["deploy"]["resources"]["limits"]["memory"]
    assert "ports" not in services["redis"]  # no clash with a local Redis on 6379
    for name, spec in services.items():
        for port in spec.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    assert "FLOWER_BASIC_AUTH" in " ".join(services["flower"]["entrypoint"])
    # celery-ha web listens on the compose network: without a login it refuses that, so the service
    # opts out explicitly (and says so) only when CELERY_HA_WEB_AUTH is empty.
    assert "--insecure-no-auth" in " ".join(services["web"]["entrypoint"])
    assert services["web"]["entrypoint"][:2] == ["tini", "--"]


def test_the_healthcheck_scripts_are_valid_python(services: dict) -> None:
    for name in ("flower", "web"):
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        compile(test[3], f"{name} healthcheck", "exec")


def test_the_ha_profile_runs_redis_under_three_sentinels(services: dict) -> None:
    ha = {name for name, spec in services.items() if "ha" in spec.get("profiles", [])}
    assert {"redis-master", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3", "worker-ha",
            "beat-ha"} <= ha
    assert "redis-master" in " ".join(services["redis-replica"]["command"])
    for name in ("worker-ha", "beat-ha"):
        env = services[name]["environment"]
        settings = Settings.from_env({k: interpolated(str(v)) for k, v in env.items()})  # valid as a whole
        state, broker = parse_sentinel_url(settings.redis_url), parse_sentinel_url(settings.broker_url)
        assert [host for host, _ in state.sentinels] == ["sentinel-1", "sentinel-2", "sentinel-3"]
        assert (state.db, broker.db, settings.sentinel_master) == (0, 1, "mymaster")


def test_the_sentinel_command_writes_a_valid_config(services: dict, tmp_path: Path) -> None:
    script = services["sentinel-1"]["command"][2]
    config_step = script.split("&&")[0].replace("/tmp/sentinel.conf", str(tmp_path / "s.conf"))
    subprocess.run(["sh", "-c", config_step], check=True, timeout=10)
    lines = (tmp_path / "s.conf").read_text().splitlines()
    assert "sentinel monitor mymaster redis-master 6379 2" in lines
    assert "sentinel resolve-hostnames yes" in lines and "port 26379" in lines
    assert all(line == line.strip() for line in lines)


def test_compose_config_validates_when_docker_compose_is_here() -> None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            out = subprocess.run([*cmd, "-f", str(COMPOSE), "--profile", "ha", "config", "-q"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return
    pytest.skip("neither `docker compose` nor `docker-compose` is installed on this machine")
