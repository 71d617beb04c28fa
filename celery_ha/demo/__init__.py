"""Demo pieces shipped with the package: a local simulated "legal documents" site."""

from .site import DemoSite, SiteRequest

__all__ = ["DemoSite", "SiteRequest"]
