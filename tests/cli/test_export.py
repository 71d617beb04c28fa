"""``celery-ha export --output``: writes into what it is given (file, symlink, FIFO, device, pipe)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_ha import TaskQueue
from tests.support.cli import run

CLI = [sys.executable, "-m", "celery_ha.cli"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url)


def emit(q: TaskQueue, pages: int, per_page: int, pad: int = 0) -> list[dict[str, Any]]:
    """Commit ``per_page`` items from each of ``pages`` tasks, each page re-sending the previous
    page's last item (a duplicate key). Returns the items in the order export must write them."""
    expected: list[dict[str, Any]] = []
    for page in range(pages):
        lease = q.claim(q.enqueue(f"https://example.com/{page}"), "w1")
        batch = [(f"item-{page}-{i}", {"page": page, "i": i, "title": f"Ü {page}/{i}", "pad": "x" * pad})
                 for i in range(per_page)]
        if page:
            batch.insert(0, (f"item-{page - 1}-{per_page - 1}", expected[-1]))  # already stored: ignored
        q.commit(lease, batch)
        q.complete(lease)
        expected += [item for _, item in batch[1 if page else 0:]]
    return expected


def jsonl(items: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def export(redis_url: str, *args: str):
    return run(["--redis-url", redis_url, "export", *args])


def test_regular_file_gets_every_item_once_in_commit_order(redis_url: str, q: TaskQueue,
                                                          tmp_path: Path) -> None:
    expected = emit(q, pages=3, per_page=4)
    out = tmp_path / "items.jsonl"
    result = export(redis_url, "--output", str(out))
    assert result.exit_code == 0, result.output
    assert f"exported {len(expected)} item(s) to {out}" in result.stderr
    text = out.read_text(encoding="utf-8")
    assert text == jsonl(expected)
    rows = [json.loads(line) for line in text.splitlines()]
    assert len({(row["page"], row["i"]) for row in rows}) == len(rows) == 12
    out.write_text("old content that is longer than nothing\n" * 100)
    assert export(redis_url, "-o", str(out)).exit_code == 0
    assert out.read_text(encoding="utf-8") == jsonl(expected)  # replaced whole, not overwritten in part
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640, 0o664])
def test_existing_file_keeps_its_mode(redis_url: str, q: TaskQueue, tmp_path: Path, mode: int) -> None:
    expected = emit(q, pages=1, per_page=2)
    out = tmp_path / "items.jsonl"
    out.write_text("previous\n")
    out.chmod(mode)
    result = export(redis_url, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert out.read_text(encoding="utf-8") == jsonl(expected)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_honours_the_umask(redis_url: str, q: TaskQueue, tmp_path: Path, mask: int,
                                    mode: int) -> None:
    emit(q, pages=1, per_page=1)
    out = tmp_path / "new.jsonl"
    with umask(mask):
        result = export(redis_url, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == mode


def test_symlink_is_written_through_and_stays_a_link(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=2, per_page=3)
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    real = tmp_path / "data" / "items.jsonl"
    real.write_text("previous\n")
    real.chmod(0o640)
    link = tmp_path / "links" / "latest.jsonl"
    link.symlink_to(Path("..") / "data" / "items.jsonl")
    chain = tmp_path / "links" / "chain.jsonl"
    chain.symlink_to("latest.jsonl")  # a link to a link
    for target in (link, chain):
        result = export(redis_url, "-o", str(target))
        assert result.exit_code == 0, result.output
        assert link.is_symlink() and os.readlink(link) == str(Path("..") / "data" / "items.jsonl")
        assert chain.is_symlink() and os.readlink(chain) == "latest.jsonl"
        assert real.read_text(encoding="utf-8") == jsonl(expected)
        assert stat.S_IMODE(real.stat().st_mode) == 0o640
        # The temporary file lived next to the target, and is gone.
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["items.jsonl"]
        assert sorted(p.name for p in (tmp_path / "links").iterdir()) == ["chain.jsonl", "latest.jsonl"]


def test_dangling_symlink_creates_its_target(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=1, per_page=2)
    link = tmp_path / "out.jsonl"
    link.symlink_to("made-by-export.jsonl")
    assert export(redis_url, "-o", str(link)).exit_code == 0
    assert link.is_symlink()
    assert (tmp_path / "made-by-export.jsonl").read_text(encoding="utf-8") == jsonl(expected)


class FifoReader:
    """Read a FIFO in a thread (all of it, or ``lines`` lines and then hang up)."""

    def __init__(self, path: Path, lines: int | None = None) -> None:
        self.path, self.lines, self.data = path, lines, ""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, encoding="utf-8") as fifo:  # blocks until a writer opens it
            if self.lines is None:
                self.data = fifo.read()
            else:
                self.data = "".join(fifo.readline() for _ in range(self.lines))

    def join(self) -> str:
        self.thread.join(timeout=30)
        if self.thread.is_alive():  # the writer never came: release the reader, then fail
            with contextlib.suppress(OSError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
            self.thread.join(timeout=5)
            raise AssertionError(f"nothing opened {self.path} for writing")
        return self.data


def test_fifo_is_written_into_not_replaced(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=4, per_page=50, pad=200)  # more than a pipe buffer
    fifo = tmp_path / "items.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    result = export(redis_url, "-o", str(fifo))
    assert reader.join() == jsonl(expected)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert list(tmp_path.iterdir()) == [fifo]


def test_fifo_reader_hanging_up_ends_export_quietly(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=4, per_page=500, pad=200)  # ~500 KB: the writer must meet the hang-up
    fifo = tmp_path / "items.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo, lines=1)
    result = export(redis_url, "-o", str(fifo))
    assert reader.join() == jsonl(expected[:1])
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and stat.S_ISFIFO(fifo.stat().st_mode)


def test_dev_null_is_written_not_replaced(redis_url: str, q: TaskQueue) -> None:
    before = os.stat("/dev/null")
    assert stat.S_ISCHR(before.st_mode)
    emit(q, pages=2, per_page=10)
    result = export(redis_url, "-o", "/dev/null")
    assert result.exit_code == 0, result.output
    assert "exported 20 item(s) to /dev/null" in result.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert not [p for p in Path("/dev").iterdir() if p.name.startswith(".null.")]  # no temporary file


def test_failed_export_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "items.jsonl"
    out.write_text("yesterday's export\n")
    result = run(["--redis-url", "redis://127.0.0.1:1/0", "export", "-o", str(out)])
    assert result.exit_code == 3, result.output
    assert out.read_text() == "yesterday's export\n" and list(tmp_path.iterdir()) == [out]


# ---------------------------------------------------------------- real processes and pipes

def _cli(redis_url: str, *args: str) -> list[str]:
    return [*CLI, "--redis-url", redis_url, "export", *args]


@pytest.mark.parametrize("args", [(), ("-o", "-"), ("-o", "/dev/stdout")],
                         ids=["default", "dash", "dev-stdout"])
def test_pipe_closed_by_head_ends_quietly_with_exit_0(redis_url: str, q: TaskQueue,
                                                      args: tuple[str, ...]) -> None:
    expected = emit(q, pages=5, per_page=400, pad=300)  # ~700 KB: far more than a pipe holds
    exporter = subprocess.Popen(_cli(redis_url, *args), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, encoding="utf-8")
    head = subprocess.Popen(["head", "-1"], stdin=exporter.stdout, stdout=subprocess.PIPE, text=True,
                            encoding="utf-8")
    assert exporter.stdout is not None and exporter.stderr is not None
    exporter.stdout.close()  # only head holds the read end now
    try:
        first, _ = head.communicate(timeout=60)
        errors = exporter.stderr.read()
        exporter.wait(timeout=60)
    finally:
        for proc in (exporter, head):
            if proc.poll() is None:
                proc.kill()
        exporter.stderr.close()
    assert head.returncode == 0 and first == jsonl(expected[:1])
    assert exporter.returncode == 0, errors
    assert errors == "", errors  # no "Error: Broken pipe", no "Exception ignored"


def test_dev_stdout_redirected_to_a_file_appends_to_it(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=2, per_page=5)
    log = tmp_path / "log.jsonl"
    log.write_text("header line\n")
    with open(log, "a", encoding="utf-8") as stdout:  # like `celery-ha export -o /dev/stdout >> log`
        done = subprocess.run(_cli(redis_url, "-o", "/dev/stdout"), cwd=ROOT, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert log.read_text(encoding="utf-8") == "header line\n" + jsonl(expected)  # appended, not replaced
    assert list(tmp_path.iterdir()) == [log]


def test_csv_with_inferred_and_named_columns(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    import csv
    import io

    lease = q.claim(q.enqueue("https://example.com/csv"), "w1")
    q.commit(lease, [("a", {"title": "Ü, \"quoted\"", "n": 1}), ("b", {"n": 2, "tags": ["x", "y"]}),
                     ("c", {"title": "line\nbreak", "extra": None})])
    result = export(redis_url, "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [["title", "n", "tags", "extra"], ['Ü, "quoted"', "1", "", ""], ["", "2", '["x","y"]', ""],
                    ["line\nbreak", "", "", ""]]
    target = tmp_path / "out.csv"
    result = export(redis_url, "--format", "csv", "--columns", "n,title", "-o", str(target))
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(target.read_text()))) == [
        ["n", "title"], ["1", 'Ü, "quoted"'], ["2", ""], ["", "line\nbreak"]]
    assert "exported 3 item(s)" in result.stderr


def test_a_hard_linked_file_keeps_its_links(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    expected = emit(q, pages=1, per_page=3)
    target, other = tmp_path / "items.jsonl", tmp_path / "same-items.jsonl"
    target.write_text("old\n")
    os.link(target, other)
    result = export(redis_url, "--output", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_text() == other.read_text() == jsonl(expected)
    assert os.stat(target).st_ino == os.stat(other).st_ino
