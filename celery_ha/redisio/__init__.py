"""Redis plumbing: URLs and clients, the Lua script loader and caller, shared Lua helpers (the
clock, the compare-and-delete unlock), the one short lock. Above ``celery_ha.base`` only."""
