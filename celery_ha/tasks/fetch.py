"""``fetch_page``: GET one page, parse its title and text, emit one item keyed by URL."""

from __future__ import annotations

from typing import Any

from bs4 import BeautifulSoup

from celery_ha.integration import DurableContext, durable_task

MAX_TEXT_CHARS = 100_000


def parse_page(html: str) -> dict[str, Any]:
    """Title and visible text of an HTML page (scripts and styles dropped)."""
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript"]):
        tag.decompose()
    title = soup.title.get_text(strip=True) if soup.title else ""
    if not title:
        h1 = soup.find("h1")
        title = h1.get_text(strip=True) if h1 else ""
    body = soup.body or soup
    text = " ".join(body.get_text(" ", strip=True).split())
    return {"title": title, "text": text[:MAX_TEXT_CHARS]}


@durable_task(name="fetch_page", item_key="url")
def fetch_page(ctx: DurableContext) -> None:
    """Fetch ``ctx.url``; 404/410 fail the task for good, 5xx/429/captcha retry with backoff. The
    page's title and text sign the run's output, so an adaptive refetch schedule backs off while the
    page does not change."""
    response = ctx.fetch(ctx.url)  # conditional: a 304 completes the task as unchanged, no item
    page = parse_page(response.text)
    ctx.signature(page)  # what an adaptive refetch schedule compares (state/schedules.py)
    item = {"url": ctx.url, "status": response.status_code, **page}
    if ctx.meta:
        item["meta"] = ctx.meta
    ctx.emit(item)
