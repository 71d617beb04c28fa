"""The shape of the code, checked: layers, no cycles, small modules, Lua contracts, one settings door."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_ha"
MAX_MODULE_LINES = 420  # "none over ~400 lines"


def _python_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_layers_and_acyclic_contracts_hold() -> None:
    """import-linter's contracts from pyproject.toml: a back-edge or a cycle fails here and in CI."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_every_layer_is_a_folder_and_modules_stay_small() -> None:
    top_level = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top_level == ["__init__.py"], f"modules outside a layer folder: {top_level}"
    too_big = {str(p.relative_to(ROOT)): n for p in _python_files()
               if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not too_big, too_big


def test_every_lua_script_opens_with_its_contract() -> None:
    """Each .lua opens with a --[[ ]] header naming its KEYS, ARGV and replies (an include: what it
    defines)."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.lua")):
        head = path.read_text(encoding="utf-8").lstrip()
        block = head[: head.find("]]")] if head.startswith("--[[") else ""
        include = path.stem.startswith("_") or path.parent.name == "lua"
        needed = ("Defines",) if include and "Reply" not in block else ("KEYS", "ARGV", "Repl")
        if not block or not all(word in block for word in needed):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"scripts without a KEYS/ARGV/reply header: {missing}"


def test_no_inline_lua_outside_script_files() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _python_files()
                 if re.search(r"redis\.call\(|\bclient\.eval\(\s*['\"]", p.read_text(encoding="utf-8"))]
    assert not offenders, offenders


def test_celery_ha_knobs_are_read_only_by_settings() -> None:
    """Every CELERY_HA_* variable goes through celery_ha.base.settings (validated once)."""
    pattern = re.compile(r"environ(?:\.get)?\s*[\[(]\s*['\"]CELERY_HA_|getenv\(\s*['\"]CELERY_HA_")
    offenders = [str(p.relative_to(ROOT)) for p in _python_files()
                 if p.name != "settings.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert not offenders, offenders


def test_tests_mirror_the_package() -> None:
    """A test folder per layer (the composition root is exercised by every Celery run), slow chaos
    runs apart in tests/chaos, helpers in tests/support (no test modules there)."""
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    tests = ROOT / "tests"
    missing = sorted(layer for layer in layers - {"celery_app"} if not (tests / layer).is_dir())
    # besides the layers: tests/architecture (this file), tests/chaos, tests/deploy (compose), support
    assert not missing, f"layers without a test folder: {missing}"
    assert not list((tests / "support").glob("test_*.py"))
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "conftest.py"]
