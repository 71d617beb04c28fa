"""Upkeep of a namespace: the maintenance sweep (reclaim, redispatch, pump), the per-process sweep
watchdog that runs it when beat is away, and the broker epoch that notices a broker that lost its
messages."""
