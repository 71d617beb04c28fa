"""Admin pages for staff: counts per state, dead letters (with redrive), one task, the outbox backlog.

Tasks live in Redis, not in the database, so these are plain views wrapped by the admin site (staff
only: anyone else is sent to the admin login) rather than ModelAdmins. Include them under the
admin's prefix (see ``celery_ha.contrib.django.urls``). Changes (redrive, relay) are POSTs with
Django's CSRF check; a Redis that does not answer gives a page saying so, not a server error.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import redis
from django.contrib import admin, messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils.timezone import now
from django.views.decorators.http import require_http_methods

from celery_ha.base.errors import CeleryHAError, TaskNotFound
from celery_ha.base.masking import mask_url
from celery_ha.contrib.django.models import OutboxEntry
from celery_ha.contrib.django.outbox import relay
from celery_ha.contrib.django.runtime import runtime
from celery_ha.state import TaskQueue

#: The states shown first on the dashboard, in the order of a task's life.
STATES = ("queued", "dispatched", "running", "delayed", "completed", "dead")
DEAD_PAGE = 50
OUTBOX_PAGE = 100
View = Callable[..., HttpResponse]


def _page(request: HttpRequest, template: str, title: str, **context: Any) -> HttpResponse:
    rt = runtime()
    context.update(admin.site.each_context(request), title=title, namespace=rt.config.settings.namespace,
                   redis_url=mask_url(rt.config.settings.redis_url or "embedded Redis"))
    return render(request, f"celery_ha/{template}", context)


def _guarded(view: View) -> View:
    """Staff only (admin_view), and an unreachable Redis shown as such (HTTP 503)."""

    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            response = _page(request, "unreachable.html", "celery-ha: Redis unreachable",
                             error=mask_url(str(exc)))
            response.status_code = 503
            return response

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return admin.site.admin_view(wrapped)


def _when(seconds: float | None) -> datetime | None:
    """A Redis-clock timestamp (seconds) as an aware datetime, which templates format."""
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc)


def _queue() -> TaskQueue:
    return runtime().queue()


def _outbox_summary() -> dict[str, Any]:
    entries = OutboxEntry.objects.all()
    oldest = entries.order_by("created_at").values_list("created_at", flat=True).first()
    return {"count": entries.count(), "oldest": oldest,
            "age": None if oldest is None else (now() - oldest).total_seconds()}


def dashboard(request: HttpRequest) -> HttpResponse:
    """Counts per state, lifetime counters and the outbox backlog; a task id box."""
    wanted = request.GET.get("task", "").strip()
    if wanted:
        try:
            return HttpResponseRedirect(reverse("celery_ha:task", args=[wanted]))
        except NoReverseMatch:  # a '/' in it: no task id has one
            messages.error(request, "not a task id")
    stats = _queue().stats()
    states = [(name, stats.get(name, 0)) for name in STATES]
    counters = sorted((name, value) for name, value in stats.items() if name not in STATES)
    return _page(request, "dashboard.html", "celery-ha", states=states, counters=counters,
                 outbox=_outbox_summary())


@require_http_methods(["GET", "POST"])
def dead_letters(request: HttpRequest) -> HttpResponse:
    """Dead tasks, oldest death first, with their reasons; POST redrives the chosen ones (or all)."""
    queue = _queue()
    if request.method == "POST":
        if request.POST.get("all"):
            moved = queue.redrive(None)
        else:
            moved = 0
            for task_id in request.POST.getlist("ids"):
                try:
                    moved += queue.redrive(task_id)
                except CeleryHAError:  # unknown or malformed id: nothing to move
                    continue
        messages.success(request, f"redrove {moved} task(s)")
        return HttpResponseRedirect(reverse("celery_ha:dead"))
    try:
        offset = max(0, int(request.GET.get("offset", 0)))
    except ValueError:
        offset = 0
    rows = [(t, _when(t.updated_at)) for t in queue.dead(limit=DEAD_PAGE, offset=offset)]
    total = queue.stats()["dead"]
    return _page(request, "dead.html", "celery-ha: dead letters", rows=rows, total=total, offset=offset,
                 previous=max(0, offset - DEAD_PAGE) if offset else None,
                 next=offset + DEAD_PAGE if offset + DEAD_PAGE < total else None)


@require_http_methods(["GET", "POST"])
def task_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    """One task: state, attempts, stalls, last errors, holder, meta and checkpoint; POST redrives it."""
    queue = _queue()
    try:
        info = queue.get(task_id)
    except (TaskNotFound, CeleryHAError):
        raise Http404(f"no task {task_id[:64]!r} in namespace {queue.namespace!r}") from None
    if request.method == "POST":
        moved = queue.redrive(task_id)
        messages.success(request, f"redrove task {task_id}" if moved else f"task {task_id} is not dead")
        return HttpResponseRedirect(reverse("celery_ha:task", args=[task_id]))
    times = [("created", _when(info.created_at)), ("updated", _when(info.updated_at)),
             ("due", _when(info.due_at))]
    return _page(request, "task.html", f"celery-ha: task {task_id}", task=info, times=times,
                 checkpoint=queue.checkpoint(task_id),
                 pending=OutboxEntry.objects.filter(task_id=task_id).count())


@require_http_methods(["GET", "POST"])
def outbox(request: HttpRequest) -> HttpResponse:
    """The requests committed but not in Redis yet, oldest first; POST relays them now."""
    if request.method == "POST":
        try:
            report = relay()
        except CeleryHAError as exc:  # the configuration (not a row) is refused: the rows stay as they are
            messages.error(request, f"the relay stopped; the requests not pushed stay in the outbox: {exc}")
            return HttpResponseRedirect(reverse("celery_ha:outbox"))
        if report.error:
            messages.error(request, f"Redis did not answer: {report.error}; {report.left} request(s) stay")
        else:
            messages.success(request, f"relayed {report.pushed} request(s), {report.left} left")
        return HttpResponseRedirect(reverse("celery_ha:outbox"))
    entries = list(OutboxEntry.objects.order_by("created_at")[:OUTBOX_PAGE])
    return _page(request, "outbox.html", "celery-ha: outbox", entries=entries, summary=_outbox_summary())


dashboard_view = _guarded(dashboard)
dead_view = _guarded(dead_letters)
task_view = _guarded(task_detail)
outbox_view = _guarded(outbox)
