"""Where a script's ``--#include`` lines are looked up: the script's own folder (a layer's prelude,
such as the fencing check) first, then ``celery_ha/redisio/lua/`` (helpers every layer shares: the
clock). Shared by the script loader (``scripts.py``) and the function libraries (``functions.py``)."""

from __future__ import annotations

import re
from pathlib import Path

SHARED_LUA = Path(__file__).parent / "lua"
INCLUDE = re.compile(r"^--#include\s+(\S+)\s*$", re.MULTILINE)


def include_path(folder: Path, name: str) -> Path:
    own = folder / f"{name}.lua"
    return own if own.exists() else SHARED_LUA / f"{name}.lua"
