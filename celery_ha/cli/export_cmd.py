"""``celery-ha export``: write the result sink out as JSON Lines.

``--output PATH`` writes into what PATH names, like a shell redirection would:

* a regular file (or a new one) is written atomically: a temporary file next to the *final* target
  (symlinks resolved, so a link stays a link), fsynced, then renamed over it. An existing file keeps
  its mode (and, where permitted, its owner); a new one gets ``0666 & ~umask``. A file with other
  hard links is rewritten in place instead (a rename would split it from them), not atomically.
* a FIFO, a device (``/dev/null``, a tty) or an open descriptor (``/dev/stdout``, ``/dev/fd/N``,
  ``/proc/self/fd/N``) is opened and written to, never replaced; our own descriptors are written
  through a duplicate, so ``>> log`` keeps appending and nothing is truncated.

A reader that goes away (``export | head -1``) ends the export quietly with exit 0, as for other
Unix tools.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import IO, Any, NamedTuple

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.errors import silence_stdout
from celery_ha.cli.formats import FORMATS, write_csv, write_jsonl
from celery_ha.cli.known import warn_unknown
from celery_ha.state.sink import count_items, iter_items

#: A directory of open descriptors, as ``realpath`` spells it (``/proc/self`` -> ``/proc/PID``).
_FD_DIR = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")
_MAX_LINKS = 40  # the kernel's limit on symlinks followed in one lookup


class Target(NamedTuple):
    """Where ``--output`` leads."""

    path: str  # the final path, every symlink followed
    descriptor: bool  # the path names an open descriptor (of any process): write into it
    own_fd: int | None  # ... and when it is one of ours, its number


def resolve(output: str) -> Target:
    """Follow ``output``'s symlinks one by one, stopping at a descriptor directory (``/proc/PID/fd``).

    ``os.path.realpath`` would resolve ``/dev/stdout`` redirected to ``log`` into ``log``, and
    replacing ``log`` would then break ``>> log`` (or drop what the shell wrote before us).
    """
    path = os.path.abspath(output)
    for _ in range(_MAX_LINKS + 1):
        parent = os.path.realpath(os.path.dirname(path))
        path = os.path.join(parent, os.path.basename(path))
        fd_dir = _FD_DIR.fullmatch(parent)
        if fd_dir:
            name = os.path.basename(path)
            own = int(fd_dir.group(1)) == os.getpid() and name.isdigit()
            return Target(path, True, int(name) if own else None)
        try:
            link = os.readlink(path)
        except OSError:  # not a symlink (or nothing there yet): the end of the chain
            return Target(path, False, None)
        path = os.path.join(parent, link)
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), output)


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Output:
    """An open ``--output``: write to :attr:`stream`, then :meth:`commit`; :meth:`close` always.

    For a regular file the stream is a temporary file that :meth:`commit` renames over the target;
    closed without a commit, the temporary file is removed and the target left as it was.
    """

    def __init__(self, stream: IO[str], tmp: str | None = None, final: str | None = None) -> None:
        self.stream = stream
        self._tmp = tmp
        self._final = final

    def commit(self) -> None:
        self.stream.flush()
        if self._tmp is None or self._final is None:
            return
        os.fsync(self.stream.fileno())
        self.stream.close()
        os.replace(self._tmp, self._final)
        self._tmp = None
        with contextlib.suppress(OSError):  # make the rename itself durable, where the OS lets us
            dir_fd = os.open(os.path.dirname(self._final), os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def close(self) -> None:
        try:
            with contextlib.suppress(BrokenPipeError):  # the reader is gone: nothing left to flush to
                self.stream.close()
        finally:
            if self._tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._tmp)
                self._tmp = None


def open_output(output: str) -> Output:
    """Open ``output`` for writing as described in the module docstring."""
    target = resolve(output)
    if target.own_fd is not None:
        return Output(os.fdopen(os.dup(target.own_fd), "w", encoding="utf-8"))
    try:
        st: os.stat_result | None = os.stat(target.path)
    except FileNotFoundError:
        st = None
    if target.descriptor or (st is not None and not stat.S_ISREG(st.st_mode)):
        return Output(open(output, "w", encoding="utf-8"))  # closed by Output.close
    if st is not None and st.st_nlink > 1:
        # A file with other hard links: a rename would detach this name from them, so it is
        # rewritten in place (not atomic: an interrupted export leaves it partly written).
        return Output(open(target.path, "w", encoding="utf-8"))
    directory, name = os.path.split(target.path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=directory)
    except OSError as exc:  # name what the user asked for, not our temporary file
        raise OSError(exc.errno, exc.strerror, output) from None
    try:
        if st is None:
            os.fchmod(fd, 0o666 & ~current_umask())
        else:
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                with contextlib.suppress(OSError):  # only root may give a file away
                    os.fchown(fd, st.st_uid, st.st_gid)
        stream = os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return Output(stream, tmp, target.path)


def write_items(out: IO[str], items: Iterable[Any], fmt: str, columns: list[str] | None,
                tick: Callable[[], None]) -> int:
    if fmt == "csv":
        return write_csv(out, items, tick, columns)
    return write_jsonl(out, items, tick)


def _columns(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [c.strip() for c in value.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise click.BadParameter("a comma-separated list of distinct, non-empty field names")
    return names


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True,
              help="jsonl: one item per line (lossless); csv: a header row, then a column per field.")
@click.option("--columns", callback=_columns, metavar="A,B,…",
              help="CSV columns, in order (default: the fields of the first 1,000 items).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True, allow_dash=True), default="-",
              show_default=True, help="File to write ('-' = stdout). A regular file is replaced atomically "
                                      "(mode kept, symlinks followed); a FIFO or device is written into.")
@pass_cli
def command(obj: CLIContext, fmt: str, columns: list[str] | None, output: str) -> None:
    """Export every item the crawl emitted (each exactly once), in commit order.

    Writing to a file shows a progress bar on a terminal's stderr.
    """
    if columns is not None and fmt != "csv":
        raise click.UsageError("--columns goes with --format csv")
    items = iter_items(obj.client, obj.namespace)
    if output == "-":
        warn_unknown(obj)
        try:
            count = write_items(sys.stdout, items, fmt, columns, lambda: None)
        except BrokenPipeError:  # the reader is gone (`| head`): stop quietly, like other tools
            silence_stdout()
            return
        click.echo(f"exported {count} item(s)", err=True)
        return
    out = open_output(output)
    warn_unknown(obj)  # after the output's own checks: a bad path is the one error line
    total = count_items(obj.client, obj.namespace)
    try:
        with click.progressbar(length=total, label="exporting", file=sys.stderr,
                               hidden=not sys.stderr.isatty()) as bar:
            count = write_items(out.stream, items, fmt, columns, lambda: bar.update(1))
        out.commit()
    except BrokenPipeError:  # a FIFO's or pipe's reader is gone
        return
    finally:
        out.close()
    click.echo(f"exported {count} item(s) to {output}", err=True)
