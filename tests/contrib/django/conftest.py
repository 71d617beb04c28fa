"""The Django test project, run in child processes against a real database and a real Redis.

Django is never configured in the pytest process: ``celery_ha.base.settings`` falls back to
``django.conf.settings`` whenever Django is configured, so doing it here would hand this project's
settings to every later test of the suite. Children get the database and Redis through ``DJPROJ_*``
variables (``CELERY_HA_*`` ones are removed from their environment, so the ``CELERY_HA`` dict is what
configures them). The database is PostgreSQL at 127.0.0.1:5432 when it answers (a database of our
own, created and dropped here) and SQLite always; ``DJPROJ_PYTHONPATH`` puts another Django (4.2,
say) in front for the children.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).parent / "project"
PG_DSN = "host=127.0.0.1 port=5432 user=postgres connect_timeout=2"
#: Tables a test may have written, emptied before the next one (children of auth_user first).
_TABLES = ("django_admin_log", "django_session", "auth_user_groups", "auth_user_user_permissions",
           "auth_user", "celery_ha_outbox", "shop_order")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("CELERY_HA_") or k in ("CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("DJPROJ_PYTHONPATH"), str(PROJECT),
                                                    os.environ.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


class Database:
    """The test project's database, read and cleaned from the pytest process with plain drivers."""

    def __init__(self, engine: str, name: str) -> None:
        self.engine, self.name = engine, name

    @property
    def env(self) -> dict[str, str]:
        return {"DJPROJ_DB_ENGINE": self.engine, "DJPROJ_DB_NAME": self.name}

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.engine == "sqlite":
            with sqlite3.connect(self.name, timeout=20) as conn:
                return conn.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(f"{PG_DSN} dbname={self.name}", autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT COUNT(*) FROM {table}")[0][0])

    def insert_outbox(self, task_id: str, spec: dict[str, Any], namespace: str = "shop") -> None:
        """A row as ``enqueue_on_commit`` leaves it when its push never happened."""
        pk = uuid.uuid4().hex if self.engine == "sqlite" else str(uuid.uuid4())  # Django's storage forms
        text = json.dumps(spec).replace("'", "''")
        self.query("INSERT INTO celery_ha_outbox (id, created_at, namespace, task_id, spec, attempts, "
                   f"last_error) VALUES ('{pk}', CURRENT_TIMESTAMP, '{namespace}', '{task_id}', '{text}', "
                   "0, '')")

    def clean(self) -> None:
        for table in _TABLES:
            self.query(f"DELETE FROM {table}")


def _postgres_answers() -> str | None:
    """None when PostgreSQL answers at 127.0.0.1:5432, else why not."""
    try:
        import psycopg

        with psycopg.connect(f"{PG_DSN} dbname=test", autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at 127.0.0.1:5432 does not answer ({type(exc).__name__}: {exc})"
    return None


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A migrated database of the test project: SQLite, and PostgreSQL when it answers (ours only:
    ``cha_django_<random>``, dropped afterwards)."""
    if request.param == "sqlite":
        db = Database("sqlite", str(tmp_path_factory.mktemp("djdb") / "db.sqlite3"))
    else:
        why = _postgres_answers()
        if why:
            pytest.skip(why)
        import psycopg

        db = Database("postgresql", f"cha_django_{os.getpid()}_{secrets.token_hex(4)}")
        with psycopg.connect(f"{PG_DSN} dbname=test", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db.name}")
    try:
        out = subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=PROJECT,
                             capture_output=True, text=True, timeout=120,
                             env=child_env({**db.env, "DJPROJ_REDIS_URL": "redis://127.0.0.1:1/0"}))
        assert out.returncode == 0, out.stderr
        yield db
    finally:
        if db.engine == "postgresql":
            import psycopg

            with psycopg.connect(f"{PG_DSN} dbname=test", autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {db.name} WITH (FORCE)")


class Project:
    """Runs the test project's scenarios and manage.py commands in child processes."""

    def __init__(self, db: Database, redis_url: str, namespace: str = "shop") -> None:
        self.db = db
        self.env = {**db.env, "DJPROJ_REDIS_URL": redis_url, "DJPROJ_NAMESPACE": namespace}

    def environ(self, **extra: str) -> dict[str, str]:
        return child_env({**self.env, **extra})

    def scenario(self, name: str, env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "scenarios.py", name, json.dumps(kwargs)], cwd=PROJECT,
                             capture_output=True, text=True, timeout=120, env=self.environ(**(env or {})))
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        assert out.returncode == 0 and lines, f"{name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        return json.loads(lines[-1].removeprefix("RESULT "))

    def start(self, name: str, **kwargs: Any) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "scenarios.py", name, json.dumps(kwargs)], cwd=PROJECT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.environ())

    def manage(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, capture_output=True,
                              text=True, timeout=120, env=self.environ(**(env or {})))


@pytest.fixture(autouse=True)
def _django_stays_out_of_this_process() -> Iterator[None]:
    """Every test here leaves Django unconfigured in the pytest process (nothing leaks to later tests)."""
    yield
    conf = sys.modules.get("django.conf")
    assert conf is None or not conf.settings.configured, "Django got configured in the pytest process"


@pytest.fixture
def project(database: Database, redis_url: str) -> Project:
    """The project on a clean database and a flushed Redis (namespace ``shop``)."""
    database.clean()
    return Project(database, redis_url)
