"""Integrations with other frameworks (Django, Scrapy): the top layer, each an optional extra."""
