"""The admin pages' URLs. Include them before the admin site's own, under its prefix::

    urlpatterns = [
        path("admin/celery-ha/", include("celery_ha.contrib.django.urls")),
        path("admin/", admin.site.urls),
    ]
"""

from __future__ import annotations

from django.urls import path

from celery_ha.contrib.django import admin_views

app_name = "celery_ha"

urlpatterns = [
    path("", admin_views.dashboard_view, name="dashboard"),
    path("dead/", admin_views.dead_view, name="dead"),
    path("task/<str:task_id>/", admin_views.task_view, name="task"),
    path("outbox/", admin_views.outbox_view, name="outbox"),
]
