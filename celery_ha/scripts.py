"""Load the Lua scripts that implement every state transition.

Scripts are ``.lua`` files kept beside the Python module that calls them. A line ``--#include name`` pulls
in a shared snippet (for example the fencing check) from the same folder, so the logic is written once
and every script still executes as one atomic unit. Each script is called with EVALSHA and loaded with
SCRIPT LOAD when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

_INCLUDE = re.compile(r"^--#include\s+(\S+)\s*$", re.MULTILINE)


@cache
def script_source(folder: str, name: str) -> str:
    """Return the text of ``folder/name.lua`` with its ``--#include`` lines expanded (once each)."""
    base = Path(folder)

    def expand(text: str, seen: frozenset[str]) -> str:
        def replace(match: re.Match[str]) -> str:
            inc = match.group(1)
            if inc in seen:
                return ""
            return expand((base / f"{inc}.lua").read_text(encoding="utf-8"), seen | {inc})

        return _INCLUDE.sub(replace, text)

    return expand((base / f"{name}.lua").read_text(encoding="utf-8"), frozenset({name}))


class LuaScript:
    """One script bound to a client: ``script(keys=[...], args=[...])`` runs it with EVALSHA.

    Every call is a state transition on the hot path of a worker, so it talks to a pooled connection
    directly instead of going through ``Redis.execute_command``, whose per-call retry wrapper and
    telemetry cost about a fifth of a claim's client CPU. That also fixes the retry semantics for
    scripts that must not run twice: a request that could not be *sent* is sent again once on a fresh
    connection (nothing reached the server), but a request whose *reply* was lost is never re-sent
    (redis-py's default retry would run a claim or a completion a second time); the error is raised.
    Clients of other shapes (single-connection clients, clusters) take redis-py's ordinary path.
    """

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._pool = getattr(client, "connection_pool", None)
        self._direct = (isinstance(client, redis.Redis) and self._pool is not None
                        and getattr(client, "connection", None) is None)

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        if not self._direct:
            return self._via_client(command)
        pool = self._pool
        conn = pool.get_connection()
        try:
            try:
                conn.send_command(*command)
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()  # the command never reached the server whole: safe to send again
                conn.send_command(*command)
            try:
                return conn.read_response()
            except NoScriptError:
                self.client.script_load(self.script)
                conn.send_command(*command)
                return conn.read_response()
        except ResponseError:
            raise  # an error reply: the connection is in sync and goes back to the pool
        except BaseException:
            conn.disconnect()  # a reply may be half read: never hand this socket to another caller
            raise
        finally:
            pool.release(conn)

    def _via_client(self, command: tuple[Any, ...]) -> Any:
        try:
            return self.client.execute_command(*command)
        except NoScriptError:
            self.client.script_load(self.script)
            return self.client.execute_command(*command)


class ScriptSet:
    """The scripts of one folder, bound to one Redis client and looked up by attribute."""

    def __init__(self, client: redis.Redis, folder: Path, names: list[str] | None = None) -> None:
        folder = Path(folder)
        if names is None:
            names = sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_"))
        self._scripts = {n: LuaScript(client, script_source(str(folder), n)) for n in names}

    def __getattr__(self, name: str) -> LuaScript:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None
