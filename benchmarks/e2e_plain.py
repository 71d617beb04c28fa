"""The baseline of ``e2e_bench.py``: plain Celery tasks with the settings celery-ha's worker uses
(acks_late, prefetch 1, JSON only, task events on, no task-sent events), on the same Redis. With
``BENCH_PLAIN_REUSE=1`` (the bench's ``plain+reuse`` system) its kombu also reuses its Redis clients
as celery-ha's worker does (``celery_ha/integration/patches/kombu_client_reuse.py``)."""

from __future__ import annotations

import os

import redis
import requests
from bs4 import BeautifulSoup
from celery import Celery

if os.environ.get("BENCH_PLAIN_REUSE") == "1":
    from celery_ha.integration.patches import kombu_client_reuse

    kombu_client_reuse.install()

if not os.environ.get("BENCH_BROKER_URL"):  # never the machine's own Redis by default
    raise SystemExit("benchmarks.e2e_plain: BENCH_BROKER_URL is not set (e2e_bench.py sets it)")
app = Celery("e2e_plain", broker=os.environ["BENCH_BROKER_URL"])
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], result_backend=None, task_ignore_result=True,
                worker_send_task_events=True, task_send_sent_event=False, task_default_queue="plain",
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)

_clients: dict[int, tuple[redis.Redis, requests.Session]] = {}


def _io() -> tuple[redis.Redis, requests.Session]:
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = (redis.Redis.from_url(os.environ["BENCH_STATE_URL"]), requests.Session())
    return _clients[pid]


@app.task(name="plain_noop")
def noop(n: int) -> None:
    _io()[0].incr("plain:done")


@app.task(name="plain_page")
def page(url: str) -> None:
    client, session = _io()
    html = session.get(url, timeout=10).text
    title = BeautifulSoup(html, "html.parser").title
    client.hset("plain:items", url, title.get_text() if title else "")
    client.incr("plain:done")
