"""The Django app: ``INSTALLED_APPS = [..., "celery_ha.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed

from celery_ha.contrib.django import runtime


class CeleryHAConfig(AppConfig):
    """Validates ``CELERY_HA`` when Django starts, so a bad value stops the process at once with one
    line naming the key (not at the first enqueue). Connects to nothing: Redis is reached on first use."""

    name = "celery_ha.contrib.django"
    label = "celery_ha"
    verbose_name = "celery-ha"

    def ready(self) -> None:
        runtime.current_config()
        setting_changed.connect(_settings_changed, dispatch_uid="celery_ha.contrib.django")


def _settings_changed(setting: str, **_: Any) -> None:
    """``override_settings`` in a project's tests: the next use builds the runtime anew."""
    if setting == "CELERY_HA" or setting.startswith("CELERY_HA_") or setting == "CELERY_BROKER_URL":
        runtime.reset()
