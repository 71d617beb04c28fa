"""Load the Lua scripts that implement every state transition.

Scripts are ``.lua`` files kept beside the Python module that calls them. A line ``--#include name`` pulls
in a shared snippet (for example the fencing check) from the same folder, so the logic is written once
and every script still executes as one atomic unit. Each script is called with EVALSHA and loaded with
SCRIPT LOAD when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import weakref
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.connection import AbstractConnection as Connection
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # hiredis (a dependency) packs a command in C; redis-py's packer checks every argument in Python
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover
    _pack = None

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


class _Pin:
    __slots__ = ("__weakref__", "conn", "pid")

    def __init__(self, conn: Connection, pid: int) -> None:
        self.conn = conn
        self.pid = pid


class PinnedConnections:
    """One pooled connection per thread (or greenlet), kept between script calls.

    Taking a connection from redis-py's pool and giving it back costs two locks and four telemetry
    calls; a worker that runs one script per task would pay that on every task. A thread keeps its
    connection instead; it goes back to the pool when the thread ends. After a fork the child takes a
    fresh one (the parent's socket is never used by two processes). Like the pool, every use first
    checks (one poll) that the server did not close the connection meanwhile, so a restart or a
    CLIENT KILL between two calls costs a reconnect, not an error.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._local = threading.local()

    def acquire(self) -> Connection:
        pin: _Pin | None = getattr(self._local, "pin", None)
        if pin is None or pin.pid != os.getpid():
            conn = self.pool.get_connection()  # connected and checked by the pool
            pin = _Pin(conn, os.getpid())
            weakref.finalize(pin, self.pool.release, conn)
            self._local.pin = pin
            return conn
        conn = pin.conn
        try:
            if conn.can_read():  # EOF (or a reply nobody asked for): the server closed it
                conn.disconnect()  # the next send reconnects
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
        return conn


class LuaScript:
    """One script bound to a client: ``script(keys=[...], args=[...])`` runs it with EVALSHA.

    Every call is a state transition on a worker's hot path, so it skips ``Redis.execute_command``
    (retry wrapper, telemetry, a pool round per call): the command is packed by hiredis and written on
    the thread's pinned connection: about 40 % less client CPU per call (see benchmarks/RESULTS.md).
    It also fixes retry semantics for scripts that must not run twice: a request that could not be
    *sent* is sent again once on a fresh connection (nothing reached the server), but a request whose
    *reply* was lost is never re-sent (redis-py's default retry would run a claim or a completion
    again, up to 10 times): the error is raised. Other clients (single-connection, cluster) take
    redis-py's ordinary path.
    """

    def __init__(self, client: redis.Redis, source: str, pins: PinnedConnections | None = None) -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        if pins is None and _direct_capable(client):
            pins = PinnedConnections(client.connection_pool)
        self._pins = pins

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        if self._pins is None:
            return self._via_client(command)
        conn = self._pins.acquire()
        try:
            try:
                _send(conn, command)
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()  # the command never reached the server whole: safe to send again
                _send(conn, command)
            try:
                return conn.read_response()
            except NoScriptError:
                self.client.script_load(self.script)
                _send(conn, command)
                return conn.read_response()
        except ResponseError:
            raise  # an error reply: the connection is still in step
        except BaseException:
            conn.disconnect()  # a reply may be half read: start the next call on a fresh socket
            raise

    def _via_client(self, command: tuple[Any, ...]) -> Any:
        try:
            return self.client.execute_command(*command)
        except NoScriptError:
            self.client.script_load(self.script)
            return self.client.execute_command(*command)


def _direct_capable(client: object) -> bool:
    return (isinstance(client, redis.Redis) and getattr(client, "connection", None) is None
            and isinstance(getattr(client, "connection_pool", None), ConnectionPool))


def _send(conn: Connection, command: tuple[Any, ...]) -> None:
    if _pack is None:
        conn.send_command(*command)
    else:
        conn.send_packed_command([_pack(command)], check_health=True)


class ScriptSet:
    """The scripts of one folder, bound to one Redis client and looked up by attribute."""

    def __init__(self, client: redis.Redis, folder: Path, names: list[str] | None = None) -> None:
        folder = Path(folder)
        if names is None:
            names = sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_"))
        pins = PinnedConnections(client.connection_pool) if _direct_capable(client) else None
        self._scripts = {n: LuaScript(client, script_source(str(folder), n), pins) for n in names}

    def __getattr__(self, name: str) -> LuaScript:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None
