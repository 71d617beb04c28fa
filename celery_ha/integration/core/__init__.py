"""What every other part of ``integration`` uses: the per-process services (settings, Redis client,
queue), the durable task's spec, the task-facing errors, per-namespace queue names and tracing."""
