"""The task API: ``@durable_task`` turns a function into a Celery task whose messages carry only
durable task ids and whose runs go through the runner (``running``)."""
