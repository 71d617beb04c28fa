"""``celery-ha up`` and ``celery-ha demo`` run the dashboard: up's plan starts a working ``celery-ha web``
child on loopback, a busy port is one line before anything starts, and the demo falls back to a free
port when 8808 is taken."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path

import click
import pytest

from celery_ha.cli.context import CLIContext
from celery_ha.cli.up_cmd import build_plan, check_port_free, child_env
from celery_ha.demo.runner import dashboard_port
from celery_ha.runtime.redis_process import free_port
from tests.support.polling import wait_until


def test_up_plans_a_web_child_that_serves_the_namespace(redis_url: str, tmp_path: Path) -> None:
    obj = CLIContext(redis_url_option=redis_url, namespace_option="upweb")
    port = free_port()
    plan = {name: (argv, env) for name, argv, env in build_plan(
        obj, "celery_ha", child_env(obj), tmp_path, concurrency=1, loglevel="info", no_beat=True,
        no_flower=True, flower_port=5555, auth=None, web_port=port)}
    argv, env = plan["web"]
    assert argv[-3:] == ["web", "--port", str(port)] and env["CELERY_HA_NAMESPACE"] == "upweb"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def health() -> bytes | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as res:
                    return res.read()
            except OSError:
                return None

        assert b'"namespace":"upweb"' in wait_until(health, timeout=30, interval=0.1, what="the web child")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    no_web = build_plan(obj, "celery_ha", child_env(obj), tmp_path, concurrency=1, loglevel="info",
                        no_beat=True, no_flower=True, flower_port=5555, auth=None)
    assert [name for name, _, _ in no_web] == ["worker"]


def test_a_busy_dashboard_port_stops_up_before_it_starts_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(click.ClickException, match=f"127.0.0.1:{port}.*--web-port PORT or --no-web"):
            check_port_free(port)
        assert dashboard_port(port) != port  # the demo takes another one instead
    assert dashboard_port(port) == port
