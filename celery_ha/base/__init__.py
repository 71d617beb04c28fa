"""The bottom layer: what every other layer shares and that needs no Redis.

Typed errors, validated settings, input checks and size caps, ``/proc`` helpers and the fork-safe
per-process cache. Nothing here imports from another ``celery_ha`` layer.
"""
