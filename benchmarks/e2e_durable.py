"""The durable side of ``e2e_bench.py``: the same two tasks as ``e2e_plain.py`` through celery-ha
(claimed, fenced, completed in Redis; the page task's item goes through ``ctx.emit``)."""

from __future__ import annotations

import os

import requests
from bs4 import BeautifulSoup

from celery_ha.integration import DurableContext, durable_task

_sessions: dict[int, requests.Session] = {}


@durable_task(name="bench_noop")
def noop(ctx: DurableContext) -> None:
    """Nothing: what the durable path itself costs."""


@durable_task(name="bench_page", item_key="url")
def page(ctx: DurableContext) -> None:
    pid = os.getpid()
    if pid not in _sessions:  # one session per pool process, as e2e_plain.py keeps
        _sessions[pid] = requests.Session()
    session = _sessions[pid]
    html = session.get(ctx.url, timeout=10).text
    title = BeautifulSoup(html, "html.parser").title
    ctx.emit({"url": ctx.url, "title": title.get_text() if title else ""})
