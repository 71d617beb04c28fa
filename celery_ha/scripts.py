"""Load the Lua scripts that implement every state transition.

Scripts are ``.lua`` files kept beside the Python module that calls them. A line ``--#include name`` pulls
in a shared snippet (for example the fencing check) from the same folder, so the logic is written once
and every script still executes as one atomic unit. Each script is registered once per client with
redis-py's :class:`redis.commands.core.Script`, which calls EVALSHA and falls back to loading the script
when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import redis

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


class ScriptSet:
    """The scripts of one folder, registered on one Redis client and looked up by attribute."""

    def __init__(self, client: redis.Redis, folder: Path, names: list[str] | None = None) -> None:
        folder = Path(folder)
        if names is None:
            names = sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_"))
        self._scripts = {n: client.register_script(script_source(str(folder), n)) for n in names}

    def __getattr__(self, name: str):
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None
