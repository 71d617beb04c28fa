"""The namespace's URL canonicalisation rules, recorded in Redis so every process makes the same ids.

A dedup id is a digest of the canonical URL (``state/ids.py``), and the canonical form depends on the
rules (``base/urls.py`` :class:`UrlRules`: fragments, stripped parameters). Two processes with
different rules would give one page two ids and crawl it twice, silently. So the first process to
enqueue into a new namespace with rules other than the defaults records them in the namespace's meta
hash, and a process whose rules differ from the recorded ones (or from the defaults, when none are
recorded) refuses its first dedup enqueue with a ConfigurationError naming both. A namespace that
already holds tasks and no record keeps the defaults: a process with other rules is refused there,
not recorded (its ids, and those of every later process, would no longer match the tasks already
queued). One read per queue object; a write only on the first use of non-default rules (HSETNX: of
two processes racing, one records and the other compares). ``TaskQueue.set_url_rules`` changes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.base.urls import DEFAULT_RULES, UrlRules
from celery_ha.state.keys import QueueKeys

#: The field of the meta hash (``cha:{ns}:meta``) holding the rules' JSON; absent = the defaults.
META_FIELD = "urlrules"


def stored_rules(client: redis.Redis, namespace: str) -> UrlRules | None:
    """The rules recorded for ``namespace``; None when none are (the defaults apply)."""
    raw = client.hget(QueueKeys(namespace).meta, META_FIELD)
    return None if raw is None else UrlRules.from_json(raw)


def checked_rules(rules: object) -> UrlRules:
    """A queue's ``url_rules`` argument: a :class:`UrlRules`, or None for the defaults."""
    if rules is None:
        return DEFAULT_RULES
    if not isinstance(rules, UrlRules):
        raise InvalidInput(f"url_rules must be a UrlRules, got {type(rules).__name__}")
    return rules


def settings_rules() -> UrlRules:
    """The rules of this process's settings (``CELERY_HA_URL_*``), read alone."""
    return UrlRules(Settings.one("url_keep_fragments"), Settings.one("url_strip_params"))


def check_rules_reading(client: redis.Redis, namespace: str, rules: UrlRules, fields: Sequence[str] = ()
                        ) -> list[str | None]:
    """Record ``rules`` for ``namespace`` if it has none, they are not the defaults and the namespace
    holds no task yet; raise ConfigurationError when they differ from what the namespace uses (the
    defaults, for a namespace with tasks and no record). ``fields``: more fields of the meta hash
    read in the same round trip (the enqueue's once-per-queue read of what else the namespace
    records), whose values are returned in order."""
    keys = QueueKeys(namespace)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.meta, [META_FIELD, *fields])
    pipe.exists(keys.stats)  # its counters exist from the namespace's first enqueue on
    (raw, *extra), written = pipe.execute()
    if raw is None and rules != DEFAULT_RULES and not written:
        # A new namespace: this process's rules become its own (of two racing, the first wins).
        recorded = rules.to_json()
        won = client.hsetnx(keys.meta, META_FIELD, recorded)
        raw = recorded if won else client.hget(keys.meta, META_FIELD)
    stored = (None if raw is None else UrlRules.from_json(raw)) or DEFAULT_RULES
    if stored != rules:
        raise ConfigurationError(
            f"namespace {namespace!r} canonicalises URLs with {stored.describe()}; this process has "
            f"{rules.describe()}. Set CELERY_HA_URL_KEEP_FRAGMENTS / CELERY_HA_URL_STRIP_PARAMS alike "
            f"in every process, or record new rules with TaskQueue.set_url_rules (README \"Dedup and "
            f"URL canonicalisation\")")
    return extra


def set_rules(client: redis.Redis, namespace: str, rules: UrlRules) -> UrlRules:
    """Record ``rules`` as the namespace's (the defaults: remove the record) and return them. Other
    processes refuse their next dedup enqueue until they run with the same rules (restart them with
    the new settings; one that already checked keeps its rules until it restarts); dedup ids of URLs
    the new rules spell differently change (README "Dedup and URL canonicalisation")."""
    rules = checked_rules(rules)
    meta = QueueKeys(namespace).meta
    if rules == DEFAULT_RULES:
        client.hdel(meta, META_FIELD)
    else:
        client.hset(meta, META_FIELD, rules.to_json())
    return rules
