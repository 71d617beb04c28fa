"""The Dockerfile: its shape (multi-stage, non-root, tini, exec form), and that what it copies is enough
to build a wheel that runs the Celery app. Built for real where a Docker engine answers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_shape() -> None:
    steps = _instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS build"), froms  # multi-stage
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][1]:]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    entry = [rest for word, rest in final if word == "ENTRYPOINT"]
    cmd = [rest for word, rest in final if word == "CMD"]
    assert entry == ['["tini", "--"]'], entry  # tini is PID 1 and forwards SIGTERM
    assert cmd and cmd[-1].startswith('["celery"'), cmd  # exec form: no shell between tini and Celery
    assert not any("pip install" in rest for word, rest in final if word in ("CMD", "ENTRYPOINT"))


def test_what_the_dockerfile_copies_builds_a_wheel_that_runs_the_app(tmp_path: Path, redis_url: str) -> None:
    """The build stage's COPY lines, replayed into an empty folder, are enough for `pip wheel`, and
    the wheel holds the Celery app, its config module, the task modules and every non-Python file —
    inside the package, with no top-level module a user's own ``tasks.py`` or ``celeryconfig.py`` could
    shadow."""
    src = tmp_path / "src"
    src.mkdir()
    for word, rest in _instructions():
        if word == "COPY" and "--from" not in rest:
            *names, _dest = rest.split()
            for name in names:
                path = ROOT / name
                if path.is_dir():
                    shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(path, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(wheels), str(src)], check=True, timeout=240)
    (wheel,) = wheels.glob("celery_ha-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"celery_ha/celery_app/config.py", "celery_ha/tasks/fetch.py",
            "celery_ha/tasks/maintenance.py"} <= names
    assert not [n for n in names if "/" not in n or n.split("/")[0] in ("tasks", "celeryconfig")]
    assets = {str(p.relative_to(ROOT)) for p in (ROOT / "celery_ha").rglob("*")
              if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    missing = sorted(assets - names)
    assert not missing, f"files the package needs at run time but the wheel lacks: {missing}"

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import importlib; from celery_ha.celery_app import app; "
            "[importlib.import_module(m) for m in app.conf.imports]; "
            "print(all(t in app.tasks for t in ('fetch_page', 'crawl_list', 'celery_ha.maintenance.sweep')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin",
                              "CELERY_HA_REDIS_URL": redis_url},  # else it starts an embedded Redis
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def test_image_builds_where_docker_runs(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no Docker engine answers on this machine (the docker client alone cannot build)")
    subprocess.run([docker, "build", "-t", "celery-ha:test", str(ROOT)], check=True, timeout=1200)
    out = subprocess.run([docker, "run", "--rm", "celery-ha:test", "celery-ha", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "celery-ha" in out.stdout
    user = subprocess.run([docker, "run", "--rm", "celery-ha:test", "id", "-u"], capture_output=True,
                          text=True, timeout=60)
    assert user.stdout.strip() != "0"
