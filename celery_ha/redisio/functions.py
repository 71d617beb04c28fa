"""One Redis 7 function library per folder of scripts that share a prelude, defined once per server.

A script run with EVAL / EVALSHA executes its whole text on every call: each ``local function`` of its
prelude is a closure made again, and garbage afterwards. A task-state script's prelude alone took
~25 µs of every call's ~110 (``benchmarks/RESULTS.md``, "Redis 7 functions"). On Redis 7 the same
scripts go into one library (``FUNCTION LOAD``): the prelude runs once, when the library loads, and
every script becomes a function of it (``FCALL``), its body run per call.

What a prelude must do on every call (read ``KEYS`` and ``ARGV``, name keys from the prefix, clear
the caches of one call) sits between a ``--#per-call`` line and an ``--#end-per-call`` line, as
assignments to locals the prelude declared above it. In a script those lines run in place, as
before; in the library they move into ``begin_call``, which every function runs first (a ``return``
there, such as same_slot's refusal, is the function's reply). ``KEYS`` and ``ARGV`` become locals of
the library that ``begin_call`` sets. ``tests/redisio/test_functions.py`` checks that every prelude
local a function may change is set again in a per-call block.

The library's name and its functions' names carry a digest of its text, so two releases of
celery-ha (a rolling upgrade) each find their own functions on the same server.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.connection import AbstractConnection as Connection
from redis.exceptions import OutOfMemoryError, ResponseError

from celery_ha.redisio.lua_source import INCLUDE, include_path

log = logging.getLogger(__name__)

# Replies that say FCALL / FUNCTION did not run: no such command (before 7.0), or an ACL without it
# (Redis 7.0 says "this user has no permissions", 7.2 and later "User <name> has no permissions").
_NO_FUNCTIONS = re.compile(
    r"(?:ERR )?(?:unknown command [`'](?:fcall|function)[`']|unknown subcommand [`']load[`']"
    r"|(?:NOPERM )?(?:this user|user \S+) has no permissions to run the [`'](?:fcall|function\|load)[`'])",
    re.IGNORECASE)
#: The placeholder of the library's name in its text while the digest is taken (the name is the digest).
_NAME = "@LIBRARY@"
PER_CALL = re.compile(r"^--#per-call\n(.*?)^--#end-per-call\n", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class LibraryText:
    """A library's source and the function each of its scripts became."""

    name: str
    text: str
    functions: dict[str, str]  # script name -> function name


def first_include(text: str) -> str | None:
    match = INCLUDE.search(text)
    return match.group(1) if match else None


@cache
def library_text(folder: str, prelude: str, names: tuple[str, ...]) -> LibraryText | None:
    """The library of the scripts among ``names`` (in ``folder``) whose first include is ``prelude``,
    or None when there is none."""
    base = Path(folder)
    bodies: dict[str, str] = {}
    includes: list[str] = []
    for name in names:
        text = (base / f"{name}.lua").read_text(encoding="utf-8")
        if first_include(text) != prelude:
            continue
        for inc in INCLUDE.findall(text):
            if inc not in includes:
                includes.append(inc)
        bodies[name] = INCLUDE.sub("", text)
    if not bodies:
        return None
    seen: set[str] = set()

    def expand(text: str) -> str:
        def replace(match: re.Match[str]) -> str:
            inc = match.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(include_path(base, inc).read_text(encoding="utf-8"))

        return INCLUDE.sub(replace, text)

    shared = expand("".join(f"--#include {inc}\n" for inc in includes))
    per_call = PER_CALL.findall(shared)
    shared = PER_CALL.sub("", shared)
    begin = ("local function begin_call(keys, args)\n  KEYS, ARGV = keys, args\n"
             + "".join(per_call) + "end\n")
    registered = "".join(
        f"redis.register_function('{_NAME}_{name}', function(keys, args)\n"
        "local refused = begin_call(keys, args)\nif refused then return refused end\n"
        f"{body}\nend)\n"
        for name, body in bodies.items())
    body = (f"-- celery-ha: the scripts of {base.name}/ that include {prelude} "
            f"(celery_ha/redisio/functions.py)\nlocal KEYS, ARGV\n{shared}{begin}{registered}")
    # The name is a digest of everything the server will run (the wrapper included), so a release that
    # changes any of it loads a library of its own rather than finding an older one "already there".
    name = "celery_ha_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:12]
    functions = {script: f"{name}_{script}" for script in bodies}
    return LibraryText(name, f"#!lua name={name}\n" + body.replace(_NAME, name), functions)


class FunctionLibrary:
    """A library as one server holds it: its text, loaded on the first ``Function not found``, and
    whether the server takes ``FCALL`` at all (None until a call tells; False on a Redis before 7.0,
    or an ACL that refuses ``FCALL`` or ``FUNCTION LOAD``: the scripts then go by ``EVALSHA``)."""

    def __init__(self, text: LibraryText) -> None:
        self.text = text
        self.usable: bool | None = None

    def command(self, script: str, sha: str, keys: Sequence[Any], args: Sequence[Any],
                evalsha: bool = False) -> tuple[Any, ...]:
        """The command that runs ``script``: its ``FCALL`` while the server may take one, else (or
        with ``evalsha``) its ``EVALSHA``."""
        if evalsha or self.usable is False:
            return ("EVALSHA", sha, len(keys), *keys, *args)
        return ("FCALL", self.text.functions[script], len(keys), *keys, *args)

    def load(self, execute: Callable[..., Any]) -> bool:
        """``FUNCTION LOAD`` the library with ``execute`` (a connection's or a client's); True when the
        server holds it now (one already there, loaded by another process meanwhile, is fine). A
        refusal that says the server or the user cannot have functions switches this library to
        ``EVALSHA``; so does a library the server will not compile (logged: a bug of celery-ha's,
        which must not stop every task). A server over ``maxmemory`` refuses the load for now only:
        False, the library stays usable, and the next ``Function not found`` loads it again."""
        try:
            execute("FUNCTION", "LOAD", self.text.text)
        except OutOfMemoryError:
            return False
        except ResponseError as exc:
            if "already exists" in str(exc):
                return True
            if not refuses_functions(exc):
                log.error("celery-ha: Redis would not load the function library %s, so its scripts run "
                          "by EVALSHA: %s", self.text.name, exc)
            self.usable = False
            return False
        return True

    def after_error(self, exc: ResponseError, execute: Callable[..., Any]) -> str | None:
        """After an error reply to an ``FCALL`` that proves it did not run, the command to send the
        call again with: "FCALL" (the library loaded now), or "EVALSHA" (the server or the user has no
        functions: from now on; or a server over ``maxmemory``, which refuses a function before it
        runs where a script runs until its first write, as before: for this call). None when the
        error is the script's own."""
        if str(exc).startswith("Function not found"):
            return "FCALL" if self.load(execute) else "EVALSHA"
        if refuses_functions(exc):
            self.usable = False
            return "EVALSHA"
        if isinstance(exc, OutOfMemoryError):
            return "EVALSHA"
        return None


def refuses_functions(exc: ResponseError) -> bool:
    """Whether an error reply says the server has no functions (before 7.0) or the user may not
    call or load them: the command did not run."""
    return bool(_NO_FUNCTIONS.match(str(exc)))


def on_connection(conn: Connection) -> Callable[..., Any]:
    """A command runner on one connection: a library's ``FUNCTION LOAD`` goes to the server (the
    cluster node) whose reply said it lacks the library."""
    def execute(*command: Any) -> Any:
        conn.send_command(*command)
        return conn.read_response()
    return execute
