"""Task ids: 12 alphanumeric characters, derived from (task, canonical URL) for dedup, else random.

A dedup id is a digest, so the same task on the same page gets the same id in every process without
asking Redis; enqueue.lua then tells a duplicate from a new task atomically.
"""

from __future__ import annotations

import hashlib
import secrets

from celery_ha.base.urls import DEFAULT_RULES, UrlRules, canonical_url, simple_canonical_url

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ID_LEN = 12  # ~71 bits: collision-free in practice, and 12 chars fit Redis' 16-byte allocation
# Byte -> alphanumeric character (byte mod 62), so an id is one C-level translate of 12 random or
# digest bytes. The first 8 characters are slightly likelier (5/256 vs 4/256): 5.95 bits per char.
_BYTE_TO_CHAR = bytes(ord(ALPHABET[b % len(ALPHABET)]) for b in range(256))


def encode_id(raw: bytes) -> str:
    """The id spelled by the first :data:`ID_LEN` bytes of ``raw``."""
    return raw[:ID_LEN].translate(_BYTE_TO_CHAR).decode("ascii")


def dedup_id(task: str, canonical: str) -> str:
    """The id of ``task`` on the page whose canonical URL is ``canonical``."""
    return encode_id(hashlib.sha256(f"{task}\0{canonical}".encode()).digest())


def task_id_for(task: str, url: str, rules: UrlRules = DEFAULT_RULES) -> str:
    """The dedup id of (task, url): SHA-256 of the canonical URL as 12 alphanumeric chars. ``rules``:
    the namespace's (``TaskQueue.url_rules``) when it sets any."""
    canonical = simple_canonical_url(url)
    return dedup_id(task, canonical_url(url, rules) if canonical is None else canonical)


def random_id() -> str:
    """A fresh id for a task enqueued without dedup (enqueue.lua reports the rare collision)."""
    return encode_id(secrets.token_bytes(ID_LEN))
