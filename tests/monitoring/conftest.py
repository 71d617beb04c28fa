"""Fixtures of the monitoring tests: real Celery clusters and the demo site (shared with tests/chaos)."""

from tests.support.celery_fixtures import make_cluster, site

__all__ = ["make_cluster", "site"]
