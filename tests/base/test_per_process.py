"""PerProcess: one value per process, rebuilt in a forked child, never shared with the parent."""

from __future__ import annotations

import os
import threading

from celery_ha.base.per_process import PerProcess


def test_value_is_built_once_per_process_and_again_after_fork() -> None:
    built: list[int] = []

    def factory() -> object:
        built.append(os.getpid())
        return object()

    cache: PerProcess[object] = PerProcess(factory)
    parent_value = cache.get()
    assert cache.get() is parent_value and built == [os.getpid()]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh value, built in the child
        child_value = cache.get()
        ok = child_value is not parent_value and built[-1] == os.getpid() and cache.get() is child_value
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert cache.get() is parent_value  # the parent keeps its own


def test_a_lock_held_at_fork_does_not_block_the_child() -> None:
    cache: PerProcess[int] = PerProcess(lambda: 7)
    cache._process_lock().acquire()  # a parent thread holds the build lock while another forks
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        done = threading.Event()
        threading.Thread(target=lambda: (cache.get(), done.set()), daemon=True).start()
        os.write(write, b"1" if done.wait(5) else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    cache._process_lock().release()
    assert answer == b"1"


def test_invalid_values_are_rebuilt() -> None:
    alive = {"ok": True}
    cache: PerProcess[dict[str, bool]] = PerProcess(lambda: dict(alive), valid=lambda v: v["ok"])
    first = cache.get()
    first["ok"] = False
    assert cache.get() is not first
