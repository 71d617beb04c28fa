"""Every patch of another library's internals (kombu, Celery, billiard), here and nowhere else.

Each module patches one private internal and declares the releases it was verified on
(``VERIFIED``; pyproject.toml's ceilings stop below the next minor release of each). At start-up it
checks that the internal still has the shape it patches; when it has not, it leaves the library as
it is, and logs one WARNING saying what is missing and what is lost without it (nothing else
breaks). Each has a test that fails when the behaviour it patches changes (tests/integration/patches/).

- ``kombu_fixes``: a command on a channel whose broker connection was closed is a connection error.
- ``kombu_client_reuse``: one redis-py client per kombu channel instead of one per command.
- ``kombu_lean_acks``: a durable task's message is not copied into kombu's ``unacked`` hash (the durable
  layer's redispatch is its ack emulation).
- ``quick_reconnect``: the worker's consumer retries a lost broker within a second, not 2 s, 4 s, ...
- ``child_reaper``: a dead pool child is noticed within a quarter second instead of 5 s.
- ``strategy_guard``: a consumer step that looks at a message of a plain task's name before Celery runs
  it, so a durable task's message sent to a plain task is not run (``task_api/misuse.py``).
- ``timeout_pid``: which pool process a hard time limit kills (read from Celery's call stack), so
  fast failover releases that process's leases only.

``registry`` holds what each decided in this process; the worker logs it in one line at start-up,
with the dispatch path of the refill messages (``integration/worker/startup_report.py``).
"""
