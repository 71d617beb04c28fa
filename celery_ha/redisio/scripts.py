"""Load the Lua scripts that implement every state transition, and bind them to a client.

Scripts are ``.lua`` files kept beside the Python module that calls them. A line ``--#include name``
pulls in a shared snippet, looked up first in the script's own folder (a layer's prelude, such as
the fencing check) and then in ``celery_ha/redisio/lua/`` (helpers every layer shares: the clock).
The logic is written once and every script still executes as one atomic unit. Calls go through
:class:`celery_ha.redisio.caller.LuaScript` (EVALSHA, loaded again on NOSCRIPT; on Redis 7, FCALL of a
function library where the set has one: :mod:`celery_ha.redisio.functions`).

A script's text runs in full on every call, so each ``local function`` of its includes is a closure
made again per call (and garbage for Lua's collector): a task-state script would define ~50 of them
where it calls ~30, and making them was a fifth of the Redis CPU of a claim. The expanded text
therefore keeps only the top-level ``local function`` blocks (one line, or from ``local function
name(`` at the start of a line to the first line that is exactly ``end``) that the rest of the script
still names; a text laid out otherwise is kept whole.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import redis

from celery_ha.redisio.caller import LuaScript, PinnedConnections, direct_capable
from celery_ha.redisio.functions import FunctionLibrary, library_text
from celery_ha.redisio.lua_source import INCLUDE, include_path
from celery_ha.redisio.lua_source import SHARED_LUA as SHARED_LUA  # lock.py and the tests read it here
from celery_ha.redisio.replicas import ReplicaWait

_DEF = re.compile(r"local function (\w+)\(")
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_WORD = re.compile(r"\w+")
_OPENERS = ("function", "if", "do")  # the Lua keywords an `end` closes (`while` and `for` use `do`)


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
            return expand(include_path(base, inc).read_text(encoding="utf-8"), seen_now)

        return INCLUDE.sub(replace, text)

    return prune_functions(expand((base / f"{name}.lua").read_text(encoding="utf-8"), frozenset({name})))


def _function_blocks(text: str) -> list[tuple[str, int, int]] | None:
    """The top-level ``local function`` blocks of ``text`` as (name, start, end) offsets: a definition
    on one line (its ``end`` words as many as the blocks it opens), or from its ``local function``
    line to the first line that is exactly ``end``, every line between them indented, blank or a
    comment. None when the text is not laid out that way."""
    blocks: list[tuple[str, int, int]] = []
    opened: tuple[str, int] | None = None
    pos = 0
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        if opened is not None:
            if line.rstrip() == "end":
                blocks.append((opened[0], opened[1], pos))
                opened = None
            elif line.strip() and not line.startswith((" ", "\t", "--")):
                return None
            continue
        match = _DEF.match(line)
        words = _WORD.findall(_COMMENT.sub("", line))
        if match and words[-1] == "end" and words.count("end") == sum(map(words.count, _OPENERS)):
            blocks.append((match.group(1), start, pos))
        elif match:
            opened = (match.group(1), start)
    return blocks if opened is None else None


def prune_functions(text: str) -> str:
    """Drop the top-level ``local function`` blocks that nothing else in ``text`` calls (comments
    aside), directly or through another kept block: what the script never calls costs nothing.
    A text laid out otherwise than :func:`_function_blocks` reads is kept whole."""
    blocks = _function_blocks(text)
    if not blocks:
        return text
    names = {name for name, _, _ in blocks}

    def named_in(chunk: str) -> set[str]:
        return set(_WORD.findall(_COMMENT.sub("", chunk))) & names

    outside = [text[end:start] for end, start in zip([0] + [b[2] for b in blocks],
                                                     [b[1] for b in blocks] + [len(text)], strict=True)]
    calls: dict[str, set[str]] = {}
    for name, start, end in blocks:
        body = text[start:end]
        calls.setdefault(name, set()).update(named_in(body[body.index("("):]))  # its own name aside
    live, todo = set(), list(named_in("".join(outside)))
    while todo:
        name = todo.pop()
        if name not in live:
            live.add(name)
            todo.extend(calls.get(name, ()))
    kept = [outside[0]]
    for (name, start, end), after in zip(blocks, outside[1:], strict=True):
        kept.append(text[start:end] if name in live else "")
        kept.append(after)
    return "".join(kept)


class ScriptSet:
    """The scripts of one folder, bound to one Redis client and looked up by attribute.

    With ``library_prelude``, the scripts whose first include is that prelude (but those of
    ``library_skip``) are also the functions of one library (:mod:`celery_ha.redisio.functions`): on
    Redis 7 they run by FCALL, their prelude made once per server rather than once per call; elsewhere
    by EVALSHA, as every other script.
    """

    def __init__(self, client: redis.Redis, folder: Path, names: list[str] | None = None,
                 wait: ReplicaWait | None = None, library_prelude: str | None = None,
                 library_skip: tuple[str, ...] = ()) -> None:
        folder = Path(folder)
        if names is None:
            names = sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_"))
        pins = PinnedConnections(client.connection_pool) if direct_capable(client) else None
        self.wait = wait
        listed = tuple(n for n in names if n not in library_skip)
        text = library_text(str(folder), library_prelude, listed) if library_prelude else None
        self.library = FunctionLibrary(text) if text is not None else None
        self._client = client
        self._scripts = {n: LuaScript(client, script_source(str(folder), n), pins, wait, self.library, n)
                         for n in names}

    def prepare(self) -> None:
        """Load every script, and the library where the server takes functions, now: no first call
        then pays a round trip for it (a benchmark's or a round-trip test's warm-up)."""
        for script in self._scripts.values():
            self._client.script_load(script.script)
        if self.library is not None:
            self.library.load(self._client.execute_command)
            if self.library.usable is None:
                self.library.usable = True

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
