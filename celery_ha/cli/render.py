"""Small output helpers shared by the commands: rich tables for people, JSON for scripts."""

from __future__ import annotations

import codecs
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_prefix, mask_url
from celery_ha.cli.errors import silence_stdout

#: Most characters a table cell shows (a checkpoint or meta can be tens of KB; ``--json`` prints all).
CELL_CHARS = 2000
#: How far past the shown width masking reads: a long password shrinks to ``***``, and the text after
#: it should still show. Past that a cut credential is masked whole (see mask_prefix).
MASK_SLACK = 2048


class _Console(Console):
    """rich's console, ending a command like every other when the reader of its pipe is gone
    (``| head``): quietly, exit 0 (rich's own way is exit 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()
        raise click.exceptions.Exit(0)


def console(stderr: bool = False) -> Console:
    """A console bound to the *current* stdout/stderr (so click's test runner captures it).

    Piped output gets a wide page (``$COLUMNS`` or 160) so ids are not folded for grep and scripts.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()):
        width = int(os.environ.get("COLUMNS") or 160)
    return _Console(file=stream, highlight=False, soft_wrap=False, width=width)


def echo_json(value: Any) -> None:
    """Print ``value`` as JSON; every string that looks like a URL is masked."""
    click.echo(mask_url(json.dumps(value, indent=2, default=str, ensure_ascii=False, sort_keys=True)))


def when(ts: float | None) -> str:
    """Epoch seconds as a short UTC timestamp ('-' when unknown)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def shown(text: str, width: int, more: str = "…") -> str:
    """``text`` masked and cut to ``width`` characters (then ending in ``more``).

    Reads at most ``width + MASK_SLACK`` characters of ``text``, however long it is.
    """
    limit = width + MASK_SLACK
    value = mask_prefix(text, limit)
    if len(value) <= width and len(text) <= limit:
        return value
    return value[: max(width - len(more), 0)] + more


def short(text: Any, width: int = 60) -> str:
    """Masked text cut to ``width`` characters for a table cell."""
    return shown("" if text is None else str(text), width)


def cell(value: Any, width: int = CELL_CHARS) -> str:
    """A table cell: '-' for nothing, else the masked text, at most ``width`` characters of it."""
    if value is None or value == "":
        return "-"
    text = str(value)
    return shown(text, width, f"… ({len(text):,} characters in all)")


def kv_table(rows: Mapping[str, Any] | Iterable[tuple[str, Any]], title: str | None = None) -> Table:
    """A two-column key/value table."""
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    items = rows.items() if isinstance(rows, Mapping) else rows
    for key, value in items:
        table.add_row(str(key), cell(value))
    return table


def grid(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> Table:
    """A table with a header row; cells are masked."""
    table = Table(title=title, header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(header, overflow="fold", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    return table


def stream_name(stream: object) -> str:
    """How a message names an input: ``stdin`` for standard input (also without a ``name``)."""
    name = getattr(stream, "name", None)
    return "stdin" if name in (None, "<stdin>", "-", 0) else str(name)


def read_lines(stream: Iterable[bytes | str], name: str = "input") -> list[tuple[int, str]]:
    """(line number, text) of a URL list, as a list: see :func:`iter_lines`."""
    return list(iter_lines(stream, name))


def iter_lines(stream: Iterable[bytes | str], name: str = "input") -> Iterator[tuple[int, str]]:
    """(line number, text) of a URL list: blank lines and full-line ``#`` comments skipped.

    Only whole-line comments: ``#`` inside a URL is a fragment, not a comment. Read as bytes, so a
    file that is not UTF-8 text (or holds NUL bytes: a binary file) is refused naming its line, and a
    UTF-8 byte-order mark (as some editors write) is dropped instead of spoiling line 1.
    """
    for number, line in enumerate(stream, 1):
        raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        if b"\0" in raw:
            raise InvalidInput(f"{name} line {number}: a NUL byte (is this a binary file?)")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{name} line {number}: not UTF-8 text (byte {raw[exc.start]:#04x} at "
                               f"column {exc.start + 1})") from None
        if text and not text.startswith("#"):
            yield number, text
