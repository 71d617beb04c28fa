"""Demo pieces shipped with the package: a local simulated "legal documents" site."""

from celery_ha.demo.site import DemoSite, SiteRequest

__all__ = ["DemoSite", "SiteRequest"]
