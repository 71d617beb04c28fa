"""Dispatch to the broker: the pump (queued tasks become messages), the refill sender thread, the
cheap publisher, the script push (a completion's script writes the refill's messages itself) and
what celery-ha knows about the broker's connection and lists."""
