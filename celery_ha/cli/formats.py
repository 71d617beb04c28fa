"""Export formats: JSON Lines (one item per line, lossless) and CSV (a column per field).

CSV needs its columns before the first row: ``--columns`` names them, else they are the fields of the
first ``SAMPLE`` items in order of first appearance (a field seen only later is left out: name it).
Cells holding a list or an object are written as compact JSON; a missing field is an empty cell.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

FORMATS = ("jsonl", "csv")
SAMPLE = 1000


def write_jsonl(out: IO[str], items: Iterable[Any], tick: Callable[[], None]) -> int:
    count = 0
    for item in items:
        out.write(json.dumps(item, ensure_ascii=False) + "\n")
        count += 1
        tick()
    out.flush()
    return count


def _cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "" if value is None else value


def csv_columns(sample: list[Any]) -> list[str]:
    """The fields of ``sample``'s objects, in order of first appearance."""
    seen: dict[str, None] = {}
    for item in sample:
        if isinstance(item, dict):
            seen.update(dict.fromkeys(str(k) for k in item))
    return list(seen)


def write_csv(out: IO[str], items: Iterable[Any], tick: Callable[[], None],
              columns: list[str] | None = None) -> int:
    stream: Iterator[Any] = iter(items)
    if columns is None:
        sample = list(itertools.islice(stream, SAMPLE))
        columns = csv_columns(sample) or ["value"]
        stream = itertools.chain(sample, stream)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    count = 0
    for item in stream:
        if isinstance(item, dict):
            writer.writerow([_cell(item.get(c)) for c in columns])
        else:  # an item that is not an object: its value (JSON for a list) in the first column
            writer.writerow([_cell(item)])
        count += 1
        tick()
    out.flush()
    return count
