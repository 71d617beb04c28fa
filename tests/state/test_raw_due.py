"""``raw_due`` of _refetch.lua (the refetch scans' reading of a raw record: a waiting head's ut and iv by
one match, other states skipped by their first bytes) agrees with ``waiting_due`` of the fully decoded
record, for every form the encoder writes: waiting heads, the compact and JSON heads they fall back to,
queued, running, delayed and unscheduled finished records. Real Redis, the real scripts' text."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import redis

from celery_ha.redisio.scripts import script_source
from celery_ha.state import TaskQueue
from tests.state.test_compact_head import (
    _STATE,
    PAYLOADS,
    codec,  # noqa: F401  (the fixture: Lua decode() then encode())
)
from tests.state.test_wait_head import _random_state


@pytest.fixture
def due_of(tmp_path: Path, r: redis.Redis):
    folder = tmp_path / "lua_due"
    shutil.copytree(_STATE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / "due.lua").write_text(
        "--#include _common\nlocal a, b = raw_due(ARGV[2]), waiting_due((decode(ARGV[2])))\n"
        "return {a and fmt(a) or 'nil', b and fmt(b) or 'nil'}\n")
    text = script_source(str(folder), "due")
    q = TaskQueue(r, "due")
    keys = q._key_lists[0]
    return lambda raw: tuple(r.eval(text, len(keys), *keys, q.keys.prefix, raw))


def test_raw_due_agrees_with_the_decoded_record(codec, due_of) -> None:  # noqa: F811
    rnd = random.Random(7)
    forms, waiting = set(), 0
    for i in range(400):
        st = _random_state(rnd)
        if i % 4 == 0:  # a state that cannot wait, or a finished one without a schedule
            st["s"] = rnd.choice("qdrwcx")
            if st["s"] in "cx":
                st.pop("iv")
        payload = rnd.choice(PAYLOADS)
        _, record, _ = codec(json.dumps(st) + "\n" + payload)
        fast, full = due_of(record)
        assert fast == full, (record, st)
        forms.add(record[:1])
        waiting += full != "nil"
    assert {"@", "{"} <= forms and waiting > 150
