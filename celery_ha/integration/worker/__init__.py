"""The worker's main process: the Celery signal receivers (``hooks``), graceful shutdown, fast
failover of a dead pool child's tasks, messages for unknown task names, and the start-up line.

The top sub-layer of ``integration``: it wires the layers below into Celery's signals and bootsteps.
"""
