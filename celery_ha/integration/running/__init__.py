"""Running one message in a pool process: claim, the task's context (``ctx``), the lease keeper that
renews it, batches, graceful stop, telling infrastructure faults from the task's, and what Celery
(and Flower) are shown of the outcome."""
