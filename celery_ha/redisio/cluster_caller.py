"""Run one Lua script on a Redis Cluster, never twice when its reply was lost.

redis-py's ``RedisCluster.execute_command`` retries a command after a connection error or a timeout
(three times by default, re-reading the slot map in between): for a claim or a completion whose reply
was lost that is a second run. This caller sends the script itself, on a connection of the node that
owns the slot of the script's first key, and re-sends it only where the cluster says it did *not*
run: ``MOVED`` (the slot lives elsewhere now: follow it and patch the slot map), ``ASK`` (a slot being
migrated: ``ASKING`` then the script, on the target), ``TRYAGAIN`` and ``CLUSTERDOWN`` (refused before
running), ``NOSCRIPT`` (a node that never saw the script, such as a replica just promoted, or a node
that took the slot in a resharding: ``SCRIPT LOAD`` there, then again; for a script that is a function
of a library, ``Function not found``: ``FUNCTION LOAD`` there), and a request that could not be
*sent* (once, on a fresh connection). A reply lost after the send raises ``redis.ConnectionError`` /
``redis.TimeoutError`` and the slot map is read again, so the next call finds the new owner after a
failover. A script with no key cannot be routed and is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection as Connection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from celery_ha.redisio.functions import FunctionLibrary, on_connection
from celery_ha.redisio.replicas import ReplicaWait

#: redis-py internals used here (``nodes_manager.move_slot`` / ``initialize`` / ``get_node_from_slot``,
#: a pool's ``get_connection()`` without arguments, ``send_packed_command``) were verified on these
#: releases; pyproject.toml's ceiling stops below the next minor (7.1 had no ``move_slot``).
VERIFIED = "redis-py 7.2.0-8.1.0"

#: Redirections and refusals followed for one call before giving up (redis-py's own TTL is 16).
MAX_HOPS = 16
_REFUSED_WAIT = 0.05  # seconds between two tries after TRYAGAIN / CLUSTERDOWN


class ClusterScript:
    """EVALSHA of one script on the master that owns its keys' slot (see the module docstring)."""

    def __init__(self, client: RedisCluster, source: str, sha: str, wait: ReplicaWait | None = None,
                 library: FunctionLibrary | None = None, name: str = "") -> None:
        self.client = client
        self.source = source
        self.sha = sha
        self._wait = wait
        self._library = library  # the script is also its function `name` (FCALL where a node can)
        self._name = name

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if not keys:
            raise ValueError("a script run on a Redis Cluster needs at least one key to route on")
        slot = self.client.keyslot(keys[0])
        ask: tuple[str, int] | None = None
        evalsha = self._library is None  # also for one call a node over maxmemory refused as FCALL
        for hop in range(MAX_HOPS):
            if evalsha or self._library is None:
                command: tuple[Any, ...] = ("EVALSHA", self.sha, len(keys), *keys, *args)
            else:
                command = self._library.command(self._name, self.sha, keys, args)
            node = self._node(slot, ask)
            pool = self.client.get_redis_connection(node).connection_pool
            try:
                conn = pool.get_connection()  # connects: a dead master fails here, nothing was sent
            except (RedisConnectionError, RedisTimeoutError):
                self._refresh()
                raise
            try:
                return self._once(conn, command, asking=ask is not None)
            except MovedError as exc:
                self.client.nodes_manager.move_slot(exc)
                ask = None
            except AskError as exc:
                ask = (exc.host, exc.port)
            except NoScriptError:
                conn.send_command("SCRIPT", "LOAD", self.source)
                conn.read_response()
            except (TryAgainError, ClusterDownError):
                time.sleep(_REFUSED_WAIT * min(hop + 1, 5))
                if hop >= 2:
                    self._refresh()
                ask = None
            except ResponseError as exc:
                kind = (self._library.after_error(exc, on_connection(conn))
                        if command[0] == "FCALL" and self._library is not None else None)
                if kind is None:
                    raise  # the script's own error reply: the connection is still in step
                evalsha = kind == "EVALSHA"  # not run: send it again (the library is on this node now)
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()
                self._refresh()  # a failover moves the slot: the next call finds its new owner
                raise
            except BaseException:
                conn.disconnect()  # a reply may be half read: the next call starts on a fresh socket
                raise
            finally:
                pool.release(conn)
        raise ClusterDownError(f"slot {slot}: still redirected or refused after {MAX_HOPS} tries")

    def _refresh(self) -> None:
        """Read the slot map again; a cluster that cannot answer now leaves the caller's own error
        (a ``redis.ConnectionError`` the task layer treats as an outage) as the one raised."""
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            self.client.nodes_manager.initialize()

    def _node(self, slot: int, ask: tuple[str, int] | None) -> ClusterNode:
        if ask is None:
            return self.client.nodes_manager.get_node_from_slot(slot)
        host, port = ask
        return self.client.get_node(host=host, port=port) or ClusterNode(host, port)

    def _once(self, conn: Connection, command: tuple[Any, ...], asking: bool) -> Any:
        """Send (ASKING,) the script, then WAIT right behind it, and read the replies in order."""
        commands = ((("ASKING",),) if asking else ()) + (command,)
        packed = conn.pack_commands(commands)
        try:
            conn.send_packed_command(packed, check_health=True)
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()  # the script never reached the server whole: safe to send again, once
            conn.send_packed_command(packed, check_health=True)
        if self._wait is not None:
            # Its own write: once the script went whole, a failure to send WAIT leaves the script's
            # outcome unknown (it may run), so it is raised as a lost reply is, never sent again.
            conn.send_packed_command(conn.pack_commands((self._wait.command,)), check_health=False)
        if asking:
            conn.read_response()
        error: BaseException | None = None
        try:
            reply = conn.read_response()
        except ResponseError as exc:  # an error reply (MOVED, NOSCRIPT, OOM …): WAIT's reply still follows
            error, reply = exc, None
        except BaseException:
            if self._wait is not None:
                conn.disconnect()  # WAIT's reply is still on the way: drop the socket
            raise
        if self._wait is not None:
            acknowledged = conn.read_response()
            if error is None:
                self._wait.check(acknowledged)
        if error is not None:
            raise error
        return reply

