"""The chaos runs' fixtures: real Celery clusters (``make_cluster``), the demo site (``site``), a
broker Redis of its own that a test may SIGKILL and restart on the same port (``broker_redis``) and
a state Redis of its own that a test may SIGSTOP (``state_redis``), and the slow sites a test starts
on 127.0.0.x, closed after it (``sites``)."""

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.celery_fixtures import make_cluster, site
from tests.support.timed_site import TimedSite

__all__ = ["make_cluster", "site"]


@pytest.fixture
def broker_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "broker").start()
    yield server
    server.stop()


@pytest.fixture
def state_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A state Redis of the test's own, which it may SIGSTOP (never the session's, never 6379)."""
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "state").start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGCONT)  # a failed test must not leave it stopped
    server.stop()


@pytest.fixture
def sites() -> Iterator[list[TimedSite]]:
    """The TimedSites a test appends here, closed after it."""
    made: list[TimedSite] = []
    yield made
    for s in made:
        s.close()
