"""Dedup under the namespace's URL rules (state/url_rules.py), on a real Redis: tracking parameters and
fragments are one URL by default, the rules change that, and every process must use the same rules."""

from __future__ import annotations

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.base.errors import ConfigurationError
from celery_ha.base.urls import DEFAULT_RULES, UrlRules
from celery_ha.state.url_rules import META_FIELD
from tests.support.invariants import check_invariants

TRACKED = "http://A.test/x?utm_source=a&b=1#f"
PLAIN = "http://a.test/x?b=1"


def test_tracking_parameters_and_fragments_dedup_by_default(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    (a, new_a), (b, new_b) = q.enqueue_many_with_status([TRACKED, PLAIN])
    assert a == b and (new_a, new_b) == (True, False)
    assert q.stats()["queued"] == 1 and q.get(a).url == TRACKED  # the first spelling is kept
    assert r.hget(q.keys.meta, META_FIELD) is None  # the defaults are not recorded
    check_invariants(r, q)


def test_rules_change_what_is_one_url_and_are_recorded(redis_url: str, r: redis.Redis) -> None:
    rules = UrlRules(keep_fragments=True, strip_params=("ref",))
    q = TaskQueue.from_url(redis_url, url_rules=rules)
    ids = q.enqueue_many([TRACKED, PLAIN, "http://a.test/x?b=1#f", "http://a.test/x?b=1&ref=tw"])
    assert ids[0] not in ids[1:] and ids[1] == ids[3] and ids[2] not in (ids[0], ids[1])
    assert q.stats()["queued"] == 3
    assert UrlRules.from_json(r.hget(q.keys.meta, META_FIELD)) == rules
    # A second process with the same rules (from the environment) agrees; one with other rules
    # refuses its first dedup enqueue and writes nothing.
    env = {"CELERY_HA_URL_KEEP_FRAGMENTS": "yes", "CELERY_HA_URL_STRIP_PARAMS": "ref"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert TaskQueue.from_url(redis_url).enqueue(PLAIN) == ids[1]
    other = TaskQueue.from_url(redis_url)  # the defaults
    with pytest.raises(ConfigurationError, match="fragments kept, stripped parameters: ref"):
        other.enqueue("http://a.test/new")
    assert other.enqueue("http://a.test/new", dedup=False)  # no dedup id: the rules do not matter
    assert q.stats()["queued"] == 4
    check_invariants(r, q)


def test_set_url_rules_records_the_change(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    a = q.enqueue(TRACKED)
    q.set_url_rules(UrlRules(strip_params=()))
    b = q.enqueue(TRACKED)
    assert a != b  # the parameter now counts: a new id
    stale = TaskQueue.from_url(redis_url)
    with pytest.raises(ConfigurationError):
        stale.enqueue(PLAIN)
    q.set_url_rules(DEFAULT_RULES)
    assert r.hget(q.keys.meta, META_FIELD) is None and stale.enqueue(PLAIN) == a


def test_a_namespace_with_tasks_keeps_the_defaults_against_a_process_with_other_rules(
        redis_url: str, r: redis.Redis) -> None:
    """One process run with other rules must not record them over a namespace whose tasks were
    queued under the defaults: every process with the defaults (the workers, whose tasks queue
    children) would then be refused, and its tasks end dead."""
    TaskQueue.from_url(redis_url).enqueue(TRACKED)  # queued under the defaults (nothing recorded)
    odd = TaskQueue.from_url(redis_url, url_rules=UrlRules(strip_params=()))
    with pytest.raises(ConfigurationError, match="canonicalises URLs with"):
        odd.enqueue(PLAIN)
    assert r.hget(odd.keys.meta, META_FIELD) is None
    assert TaskQueue.from_url(redis_url).enqueue(PLAIN)  # the defaults still go
    check_invariants(r, odd)
