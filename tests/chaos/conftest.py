"""The chaos runs' fixtures: real Celery clusters (``make_cluster``) and the demo site (``site``)."""

from tests.support.celery_fixtures import make_cluster, site

__all__ = ["make_cluster", "site"]
