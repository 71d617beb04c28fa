"""A tiny Django project using celery-ha, driven by tests/contrib/django in child processes."""
