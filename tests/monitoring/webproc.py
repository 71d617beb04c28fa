"""A real ``celery-ha web`` process for the monitoring tests, and a small HTTP client for it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery_ha.monitoring.auth import basic_header
from tests.support.polling import wait_until

_URL = re.compile(r"celery-ha web: (http://\S+)")


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        import json

        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


@dataclass
class Web:
    proc: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)
    auth: tuple[str, str] | None = None

    def request(self, path: str, *, method: str = "GET", body: bytes | None = None,
                headers: Mapping[str, str] | None = None, auth: bool = True) -> Response:
        hdrs = dict(headers or {})
        if auth and self.auth:
            hdrs.setdefault("Authorization", basic_header(*self.auth))
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=20) as res:
                return Response(res.status, dict(res.headers), res.read())
        except urllib.error.HTTPError as err:
            return Response(err.code, dict(err.headers), err.read())

    def get(self, path: str, **kw: Any) -> Response:
        return self.request(path, **kw)


@contextmanager
def web_process(redis_url: str, namespace: str, *args: str, env: Mapping[str, str] | None = None,
                auth: tuple[str, str] | None = None) -> Iterator[Web]:
    """Start ``celery-ha web --port 0`` (credentials through CELERY_HA_WEB_AUTH, never argv), wait for
    the URL it prints, yield it; SIGTERM at the end (SIGKILL if it does not stop)."""
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    full_env.pop("CELERY_HA_WEB_AUTH", None)
    if auth:
        full_env["CELERY_HA_WEB_AUTH"] = f"{auth[0]}:{auth[1]}"
    proc = subprocess.Popen([sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "-n", namespace,
                             "web", "--port", "0", *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()

    def started() -> str | None:
        found = [m.group(1) for line in list(lines) if (m := _URL.search(line))]
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError("celery-ha web exited: " + "".join(lines))
        return None

    try:
        url = wait_until(started, timeout=30, interval=0.05, what="celery-ha web to print its URL")
        yield Web(proc, url, lines, auth)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        reader.join(timeout=5)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(page: dict, name: str, **labels: str) -> float:
    return page[(name, tuple(sorted(labels.items())))]
