"""Load the Lua scripts that implement every state transition, and bind them to a client.

Scripts are ``.lua`` files kept beside the Python module that calls them. A line ``--#include name``
pulls in a shared snippet, looked up first in the script's own folder (a layer's prelude, such as
the fencing check) and then in ``celery_ha/redisio/lua/`` (helpers every layer shares: the clock).
The logic is written once and every script still executes as one atomic unit. Calls go through
:class:`celery_ha.redisio.caller.LuaScript` (EVALSHA, loaded again on NOSCRIPT).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import redis

from celery_ha.redisio.caller import LuaScript, PinnedConnections, direct_capable
from celery_ha.redisio.replicas import ReplicaWait

SHARED_LUA = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r"^--#include\s+(\S+)\s*$", re.MULTILINE)


def _include_path(folder: Path, name: str) -> Path:
    own = folder / f"{name}.lua"
    return own if own.exists() else SHARED_LUA / f"{name}.lua"


@cache
def script_source(folder: str, name: str) -> str:
    """Return the text of ``folder/name.lua`` with its ``--#include`` lines expanded (once each)."""
    base = Path(folder)

    def expand(text: str, seen: frozenset[str]) -> str:
        def replace(match: re.Match[str]) -> str:
            inc = match.group(1)
            if inc in seen:
                return ""
            seen_now = seen | {inc}
            return expand(_include_path(base, inc).read_text(encoding="utf-8"), seen_now)

        return _INCLUDE.sub(replace, text)

    return expand((base / f"{name}.lua").read_text(encoding="utf-8"), frozenset({name}))


class ScriptSet:
    """The scripts of one folder, bound to one Redis client and looked up by attribute."""

    def __init__(self, client: redis.Redis, folder: Path, names: list[str] | None = None,
                 wait: ReplicaWait | None = None) -> None:
        folder = Path(folder)
        if names is None:
            names = sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_"))
        pins = PinnedConnections(client.connection_pool) if direct_capable(client) else None
        self.wait = wait
        self._scripts = {n: LuaScript(client, script_source(str(folder), n), pins, wait) for n in names}

    def __getattr__(self, name: str) -> LuaScript:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None


def eval_script(client: redis.Redis, folder: Path | str, name: str, keys: list[Any], args: list[Any]) -> Any:
    """Run a script that is called rarely (a heartbeat every few seconds, a lock release) with plain
    EVAL: no script cache or pinned connection to keep per client. Hot paths use :class:`ScriptSet`.
    On a Redis Cluster this is redis-py's routed EVAL, which may send it again after a lost reply:
    only scripts that may run twice go here (a heartbeat, a compare-and-delete unlock)."""
    return client.eval(script_source(str(folder), name), len(keys), *keys, *args)
