"""Each patch checks the internal it patches at start-up: when that internal changed shape (a new
kombu, Celery or billiard), the library is left as it is and one WARNING says which patch is off and
why, however often the app is built. Real kombu, Celery and billiard classes, with the internal
removed or reshaped as a new release might."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from celery.concurrency.prefork import TaskPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.worker.consumer import Consumer
from kombu import Connection
from kombu.transport import redis as kombu_redis

from celery_ha.integration.patches import kombu_client_reuse, kombu_fixes, quick_reconnect, registry
from celery_ha.integration.patches.child_reaper import FastChildReaper


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_statuses", {})


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _status(name: str) -> registry.PatchStatus:
    return next(s for s in registry.statuses() if s.name == name)


def test_the_patches_are_on_with_the_libraries_installed(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kombu_redis.Channel, "_connparams", kombu_redis.Channel._connparams)
    monkeypatch.setattr(kombu_redis.Channel, "_create_client", kombu_redis.Channel._create_client)
    with caplog.at_level(logging.WARNING):
        assert kombu_fixes.install() and kombu_client_reuse.install()
    assert quick_reconnect.shape_problem() == ""
    assert [(s.name, s.state) for s in registry.statuses()] == [("kombu_fixes", "on"),
                                                                  ("kombu_client_reuse", "on")]
    assert not _warnings(caplog)


def test_kombu_fixes_leaves_a_reshaped_connparams_alone_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def connparams(self: object) -> dict[str, object]:  # a kombu whose method lost its parameter
        return {}

    monkeypatch.setattr(kombu_redis.Channel, "_connparams", connparams)
    with caplog.at_level(logging.WARNING):
        assert kombu_fixes.install() is False
        assert kombu_fixes.install() is False  # the app built again: no second warning
    assert kombu_redis.Channel._connparams is connparams
    (warning,) = _warnings(caplog)
    assert "kombu_fixes is off" in warning and "'asynchronous'" in warning
    assert "can end the worker process" in warning and kombu_fixes.VERIFIED in warning
    assert _status("kombu_fixes").state == "off"


def test_kombu_client_reuse_without_a_channel_pool_stays_off(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    original = kombu_redis.Channel._create_client
    monkeypatch.delattr(kombu_redis.Channel, "pool")
    with caplog.at_level(logging.WARNING):
        assert kombu_client_reuse.install() is False
    assert kombu_redis.Channel._create_client is original
    (warning,) = _warnings(caplog)
    assert "kombu_client_reuse is off" in warning and "Channel.pool" in warning


def test_quick_reconnect_names_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    def ensure(self: object, errback: object = None, max_retries: object = None) -> None:
        """A kombu whose connect retry takes no intervals."""

    monkeypatch.setattr(Connection, "_ensure_connection", ensure)
    assert "takes no interval_start, interval_step, interval_max" in quick_reconnect.shape_problem()
    monkeypatch.delattr(Consumer, "ensure_connected")
    assert "has no ensure_connected" in quick_reconnect.shape_problem()


def test_child_reaper_on_a_prefork_pool_without_its_internal_warns(caplog: pytest.LogCaptureFixture) -> None:
    """A prefork pool whose billiard pool is not where Celery kept it (``_pool``, or its
    ``maintain_pool``): the 5-second timer stays, and the worker says so."""
    calls: list[tuple[float, object]] = []
    hub = SimpleNamespace(call_repeatedly=lambda interval, fn: calls.append((interval, fn)))
    pool = TaskPool(1)  # not started: no billiard pool behind it
    with caplog.at_level(logging.WARNING):
        assert FastChildReaper.decide(SimpleNamespace(hub=hub, pool=pool)) is False
        pool._pool = SimpleNamespace()  # a billiard pool without maintain_pool
        assert FastChildReaper.decide(SimpleNamespace(hub=hub, pool=pool)) is False
    assert not calls
    (warning,) = _warnings(caplog)  # once per process
    assert "child_reaper is off" in warning and "has no _pool" in warning and "5 s" in warning


def test_child_reaper_is_not_needed_without_children_or_event_loop(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert FastChildReaper.decide(SimpleNamespace(hub=object(), pool=SoloPool())) is False
        assert _status("child_reaper").state == "not needed"
        assert FastChildReaper.decide(SimpleNamespace(hub=None, pool=TaskPool(1))) is False
    assert "event loop" in _status("child_reaper").why
    assert not _warnings(caplog)


def test_a_switched_off_patch_warns_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        registry.switched_off("p", "lib 1.0", "gone")
        registry.switched_off("p", "lib 1.0", "gone")
        registry.applied("p", "lib 1.0")
        registry.switched_off("p", "lib 1.0", "gone again")  # on, then off again: said again
    assert _warnings(caplog) == ["celery-ha patch p is off: gone (verified on lib 1.0)",
                                 "celery-ha patch p is off: gone again (verified on lib 1.0)"]
    assert [s.line() for s in registry.statuses()] == ["p off (gone again)"]
