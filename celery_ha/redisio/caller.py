"""Run one Lua script with EVALSHA on a hot path, never twice when its reply was lost."""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.connection import AbstractConnection as Connection
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from celery_ha.base.per_process import PerProcess
from celery_ha.redisio.cluster import is_cluster_client
from celery_ha.redisio.cluster_caller import ClusterScript
from celery_ha.redisio.functions import FunctionLibrary, on_connection
from celery_ha.redisio.replicas import ReplicaWait

#: The releases the redis-py internals used here (a pool's ``get_connection()`` without arguments,
#: which 5.3 made the rule; ``pack_commands``, ``send_packed_command``) were verified on.
VERIFIED = "redis-py 7.2.0-8.1.0"

try:  # hiredis (a dependency) packs a command in C; redis-py's packer checks every argument in Python
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover
    _pack = None


class _Pin:
    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn


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
        self._locals: PerProcess[threading.local] = PerProcess(threading.local)

    def acquire(self) -> Connection:
        local = self._locals.get()
        pin: _Pin | None = getattr(local, "pin", None)
        if pin is None:
            conn = self.pool.get_connection()  # connected and checked by the pool
            pin = _Pin(conn)
            weakref.finalize(pin, self.pool.release, conn)
            local.pin = pin
            return conn
        conn = pin.conn
        try:
            if conn.can_read():  # EOF (or a reply nobody asked for): the server closed it
                conn.disconnect()  # the next send reconnects
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
        return conn


class LuaScript:
    """One script bound to a client: ``script(keys=[...], args=[...])`` runs it with EVALSHA, or with
    FCALL when it is also a function of a :class:`FunctionLibrary` and the server takes functions
    (Redis 7: the library is loaded at the first ``Function not found``, on the connection that got it).

    Every call is a state transition on a worker's hot path, so it skips ``Redis.execute_command``
    (retry wrapper, telemetry, a pool round per call): the command is packed by hiredis and written on
    the thread's pinned connection: about 40 % less client CPU per call (see benchmarks/RESULTS.md).
    It also fixes retry semantics for scripts that must not run twice: a request that could not be
    *sent* is sent again once on a fresh connection (nothing reached the server), but a request whose
    *reply* was lost is never re-sent (redis-py's default retry would run a claim or a completion
    again, up to 10 times): the error is raised. A Redis Cluster client goes through
    :class:`celery_ha.redisio.cluster_caller.ClusterScript` (the same rule, plus MOVED / ASK / NOSCRIPT
    per node); other clients (single-connection) take redis-py's ordinary path. With a
    :class:`ReplicaWait`, ``WAIT`` is written right behind the script, in a write of its own (a send
    that fails there cannot be retried: the script may have gone whole), and its reply is read after
    the script's: still one round trip.
    """

    def __init__(self, client: redis.Redis, source: str, pins: PinnedConnections | None = None,
                 wait: ReplicaWait | None = None, library: FunctionLibrary | None = None,
                 name: str = "") -> None:
        self.client = client
        self.script = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        if pins is None and direct_capable(client):
            pins = PinnedConnections(client.connection_pool)
        self._pins = pins
        self._wait = wait
        self._commands: tuple[tuple[Any, ...], ...] = (wait.command,) if wait else ()
        # A script that is also a function of `library` (``name``) runs by FCALL where the server can.
        self._library = library if library is not None and name in library.text.functions else None
        self._name = name
        self._cluster = (ClusterScript(client, source, self.sha, wait, self._library, name)
                         if is_cluster_client(client) else None)

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The command that runs the script: its FCALL, or its EVALSHA."""
        if self._library is None:
            return ("EVALSHA", self.sha, len(keys), *keys, *args)
        return self._library.command(self._name, self.sha, keys, args)

    def _resend(self, exc: ResponseError, command: tuple[Any, ...], execute: Any, keys: Sequence[Any],
                args: Sequence[Any]) -> tuple[Any, ...] | None:
        """The command to send again after an error reply to an FCALL that proves it did not run
        (:meth:`FunctionLibrary.after_error`), or None: the error is the caller's."""
        if command[0] != "FCALL" or self._library is None:
            return None
        kind = self._library.after_error(exc, execute)
        if kind is None:
            return None
        return self._library.command(self._name, self.sha, keys, args, evalsha=kind == "EVALSHA")

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        if self._cluster is not None:
            return self._cluster(keys, args)
        if self._pins is None:
            return self._via_client(keys, args)
        conn = self._pins.acquire()
        try:
            command = self.command(keys, args)
            try:
                _send(conn, command)
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()  # the command never reached the server whole: safe to send again
                _send(conn, command)
            if self._commands:
                # WAIT in a write of its own: once the script went whole, a failure to send WAIT leaves
                # the script's outcome unknown (it may run), so it is raised as a lost reply is.
                _send(conn, *self._commands)
            for _ in range(3):  # each turn: a reply that proves the script did not run
                try:
                    return self._read(conn)
                except NoScriptError:
                    self.client.script_load(self.script)
                except ResponseError as exc:
                    resend = self._resend(exc, command, on_connection(conn), keys, args)
                    if resend is None:
                        raise
                    command = resend
                _send(conn, command, *self._commands)
            return self._read(conn)
        except ResponseError:
            raise  # an error reply: the connection is still in step
        except BaseException:
            conn.disconnect()  # a reply may be half read: start the next call on a fresh socket
            raise

    def _read(self, conn: Connection) -> Any:
        """The script's reply, then (with a ReplicaWait) WAIT's, even when the script's is an error."""
        try:
            reply = conn.read_response()
        finally:
            if self._wait is not None:
                self._wait.check(conn.read_response())
        return reply

    def _via_client(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        command = self.command(keys, args)
        for attempt in range(4):
            try:
                reply = self.client.execute_command(*command)
                break
            except NoScriptError:
                if attempt == 3:
                    raise
                self.client.script_load(self.script)
            except ResponseError as exc:
                resend = self._resend(exc, command, self.client.execute_command, keys, args)
                if attempt == 3 or resend is None:
                    raise
                command = resend
        if self._wait is not None:
            self._wait.check(self.client.execute_command(*self._wait.command))
        return reply


def direct_capable(client: object) -> bool:
    return (isinstance(client, redis.Redis) and getattr(client, "connection", None) is None
            and isinstance(getattr(client, "connection_pool", None), ConnectionPool))


def _send(conn: Connection, *commands: tuple[Any, ...]) -> None:
    """Write ``commands`` in one go (one packet when small: WAIT costs no extra round trip)."""
    if _pack is None:
        conn.send_packed_command(conn.pack_commands(commands), check_health=True)
    else:
        conn.send_packed_command([_pack(c) for c in commands], check_health=True)


