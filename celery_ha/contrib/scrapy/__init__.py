"""Scrapy on celery-ha's central proxy pool (``pip install 'celery-ha[scrapy]'``)."""
