"""celery-ha as a Django app (``pip install 'celery-ha[django]'``)."""
