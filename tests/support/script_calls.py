"""Which scripts a queue runs: how many round trips (and rows per call) a piece of work costs."""

from __future__ import annotations

import pytest

from celery_ha.state import TaskQueue


def script_calls(queue: TaskQueue, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scripts ``queue`` runs from now on, in order: its one door to its scripts,
    ``TaskQueue._run``, is wrapped (each call still runs as it would)."""
    calls: list[str] = []
    run = queue._run

    def counted(script: str, *args: object, **kw: object) -> object:
        calls.append(script)
        return run(script, *args, **kw)

    monkeypatch.setattr(queue, "_run", counted)
    return calls
