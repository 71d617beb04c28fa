"""``ctx.signature()`` (no data: the run's items) after a run resumed from its checkpoint signs every item
of the run, as a run from the start does: a page that never changes reads as unchanged in the resumed
run and in the next full run, so an adaptive schedule grows its interval at each, instead of shrinking
it twice per crash. The sum of the items before the checkpoint is kept inside the checkpoint
(``state/run_sum.py``). Real prefork worker, real redis-server, the pool child SIGKILLed mid-run, a
real site on its own loopback address whose request log shows where the resumed run started."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from celery_ha.state.sink import iter_items
from tests.support.celery_helpers import wait_for
from tests.support.http_site import QuietHandler, serve, stop

pytestmark = pytest.mark.slow

ADDRESS = "127.0.0.71"
PARTS = 6
PART_SECONDS = 0.3  # each part's answer: a run takes ~2 s, so a kill lands mid-run


class _Parts(QuietHandler):
    """Every part answers the same page after a short wait; robots.txt is 404 (no rules)."""

    requests: ClassVar[list[str]] = []  # each fixture's subclass has its own
    lock = threading.Lock()

    def do_GET(self) -> None:
        if self.path == "/robots.txt":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.lock:
            self.requests.append(self.path)
        time.sleep(PART_SECONDS)
        body = b"<title>part</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def parts_site() -> Iterator[type[_Parts]]:
    handler = type("Parts", (_Parts,), {"requests": []})
    server = serve(ADDRESS, handler, quiet_errors=True)
    handler.port = server.server_address[1]  # type: ignore[attr-defined]
    yield handler
    stop(server)


def test_a_run_resumed_from_its_checkpoint_signs_every_item_of_the_run(
        make_cluster: Any, parts_site: Any, tmp_path: Path) -> None:
    cluster = make_cluster(CELERY_HA_EXTRA_IMPORTS="tests.support.celery_tasks,tests.chaos.signature_tasks")
    q = cluster.q
    q.set_schedule("test_signed_parts", every=2, min_every=1, max_every=60, adaptive=True)
    worker = cluster.worker("w1", concurrency=1)
    verdicts = tmp_path / "verdicts.jsonl"
    url = f"http://{ADDRESS}:{parts_site.port}/list"
    tid = q.enqueue(url, task="test_signed_parts", meta={"n": PARTS, "log": str(verdicts)})
    cluster.pump()

    def runs() -> list[dict[str, Any]]:
        return [json.loads(line) for line in verdicts.read_text().splitlines()] if verdicts.exists() else []

    wait_for(lambda: len(runs()) >= 2, timeout=60, interval=0.1, message="two full runs")
    # Run 2's completion: unchanged once (2 s x 1.4), its checkpoint dropped with it.
    wait_for(lambda: q.get(tid).refetch_every == 2.8 and q.checkpoint(tid) is None, timeout=30,
             message="run 2 completed")
    # Run 3: its pool child is SIGKILLed once half of the parts are checkpointed.
    wait_for(lambda: (q.checkpoint(tid) or {}).get("i", 0) >= PARTS // 2, timeout=60, interval=0.02,
             message="run 3 half-way")
    (child,) = cluster.children(worker.node)
    os.kill(int(child["pid"]), signal.SIGKILL)
    wait_for(lambda: len(runs()) >= 4, timeout=90, interval=0.1, message="the resumed run and the next one")

    lines = runs()[:4]
    resumed = lines[2]
    assert resumed["attempt"] == 2 and resumed["from"] >= PARTS // 2  # it resumed from its checkpoint
    assert [line["changed"] for line in lines] == [None, False, False, False]
    assert q.get(tid).refetch_every == 5.488  # grown at each of the three signed runs: 2 x 1.4^3
    # The site saw the resumed attempt start at its checkpoint: the first part was asked by runs 1 and
    # 2, run 3's first attempt and run 4; the last part by runs 1, 2, 3 (resumed) and 4.
    assert parts_site.requests.count("/list/0") == 4
    assert parts_site.requests.count(f"/list/{PARTS - 1}") == 4
    assert sorted(item["part"] for item in iter_items(cluster.r, cluster.namespace)) == list(range(PARTS))
