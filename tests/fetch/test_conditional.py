"""Validators of conditional requests (fetch/conditional.py, state/validators.py): what is kept from a
response, what a request sends back, and the bounded hash on a real Redis."""

from __future__ import annotations

import pytest
import redis
from requests.structures import CaseInsensitiveDict

from celery_ha import TaskQueue
from celery_ha.base.errors import InvalidInput
from celery_ha.fetch.conditional import request_headers, validator_of
from celery_ha.state.purge import purge_namespace
from celery_ha.state.validators import load_validator, store_validator


def _headers(**values: str) -> CaseInsensitiveDict[str]:
    return CaseInsensitiveDict({k.replace("_", "-"): v for k, v in values.items()})


def test_the_etag_wins_and_dates_are_kept_as_seconds() -> None:
    both = _headers(ETag='W/"abc"', Last_Modified="Wed, 21 Oct 2015 07:28:00 GMT")
    assert validator_of(both) == 'e:W/"abc"'
    assert request_headers('e:W/"abc"') == {"If-None-Match": 'W/"abc"'}
    dated = validator_of(_headers(Last_Modified="Wed, 21 Oct 2015 07:28:00 GMT"))
    assert dated == "m:1445412480"
    assert request_headers(dated) == {"If-Modified-Since": "Wed, 21 Oct 2015 07:28:00 GMT"}
    for unusable in (_headers(), _headers(Last_Modified="yesterday"), _headers(ETag="x" * 400),
                     _headers(ETag="caf\u00e9")):
        assert validator_of(unusable) is None
    assert request_headers("z:what") == {} and request_headers("m:soon") == {}


def test_the_store_is_bounded_and_survives_what_tasks_do(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    ids = q.enqueue_many([f"http://v.test/{i}" for i in range(6)])
    for i, tid in enumerate(ids[:3]):
        assert store_validator(q, tid, f'e:"{i}"', False, limit=3) == 0
    assert store_validator(q, ids[0], 'e:"new"', True, limit=3) == 0  # an update takes no room
    assert store_validator(q, ids[3], 'e:"3"', False, limit=3) == 1  # a new one drops a random one
    assert r.hlen(q.keys.validators) == 3 and load_validator(q, ids[3]) == 'e:"3"'
    assert store_validator(q, ids[4], 'e:"4"', False, limit=1) == 3  # a lowered bound catches up
    assert r.hgetall(q.keys.validators) == {ids[4]: 'e:"4"'}
    assert store_validator(q, ids[4], None, True) == 0 and load_validator(q, ids[4]) == 'e:"4"'
    assert q.stats()["unchanged"] == 2
    with pytest.raises(InvalidInput):
        store_validator(q, ids[5], "e:" + "x" * 400, False)
    purge_namespace(q.client, q.namespace)  # `celery-ha purge` takes the validators too
    assert not r.exists(q.keys.validators)
