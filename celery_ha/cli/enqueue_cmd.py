"""``celery-ha enqueue``: queue URLs from arguments, a file, stdin or sitemaps, and say how many were new.

A list of a million URLs takes tens of seconds to queue, so with ``-f`` and a terminal on stderr a
progress bar counts the URLs sent (on stderr only: stdout keeps its one line, for scripts). With
``--sitemap`` the pages of sitemaps (robots.txt, indexes, gzip) are streamed and queued in batches
(``celery_ha.fetch.sitemap_ingest``), with a running count on a terminal's stderr.
"""

from __future__ import annotations

import json
import sys
from array import array
from typing import IO, Any

import click
import redis

from celery_ha.base.errors import CeleryHAError, InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.urls import simple_canonical_url
from celery_ha.base.validation import (
    PRIORITY_RANGE,
    check_task_name,
    check_url,
    parse_duration,
)
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.pump_hint import kick
from celery_ha.cli.render import echo_json, iter_lines, stream_name
from celery_ha.fetch.sitemap_ingest import IngestCounts, SitemapIngest, UrlFilter
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from celery_ha.state.worker_registry import known_task_names


def _meta(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg} at char {exc.pos})",
                                 param_hint="--meta") from None
    except RecursionError:
        raise click.BadParameter("nested too deeply", param_hint="--meta") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object, like '{\"source\": \"sitemap\"}'",
                                 param_hint="--meta")
    return value


def _checked_urls(urls: tuple[str, ...], source: IO[bytes] | None) -> list[str]:
    """Every URL of the arguments and of ``source``, each checked before anything is written.

    Only the URLs are kept (a failure names its place from the line number): a million-line file then
    costs its URLs' memory, not a label per line too. URLs of the common simple shape pass the enqueue
    fast path's check (:func:`simple_canonical_url`) instead of a full parse, with the same verdict.
    """
    out = list(urls)
    numbers = array("q")  # the file line of each URL after the arguments (8 bytes each)
    name = ""
    if source is not None:
        name = stream_name(source)
        for number, text in iter_lines(source, name):
            numbers.append(number)
            out.append(text)
    for i, url in enumerate(out):
        if simple_canonical_url(url) is not None:
            continue
        try:
            check_url(url)
        except InvalidInput as exc:
            where = f"argument {i + 1}" if i < len(urls) else f"{name} line {numbers[i - len(urls)]}"
            raise InvalidInput(f"{where}: {exc}") from None
    return out


@click.command("enqueue")
@click.argument("urls", nargs=-1, metavar="[URL]...")
@click.option("-f", "--file", "source", type=click.File("rb"), metavar="FILE",
              help="Read URLs from FILE, one per line ('-' = stdin); blank lines and # comments skipped.")
@click.option("--sitemap", "sitemaps", multiple=True, metavar="URL",
              help="Queue the pages of a sitemap (repeatable): a sitemap or sitemap index (.xml, .xml.gz, "
                   "text), a robots.txt or a site root (its robots.txt 'Sitemap:' lines).")
@click.option("--include", multiple=True, metavar="GLOB",
              help="With --sitemap: queue only page URLs matching one of these globs (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="With --sitemap: skip page URLs matching any of these globs (repeatable).")
@click.option("--task", default="fetch_page", show_default=True, help="Durable task that handles each URL.")
@click.option("--allow-unknown-task", is_flag=True,
              help="Queue even when the live workers do not know --task (e.g. a deployment is on its way).")
@click.option("--priority", type=click.IntRange(*PRIORITY_RANGE), default=0, show_default=True,
              help="Higher runs first.")
@click.option("--meta", "meta_json", metavar="JSON", help="JSON object stored with every task (ctx.meta).")
@click.option("--no-dedup", is_flag=True, help="Queue even if the same task+URL was queued before.")
@click.option("--recrawl-after", metavar="AGE",
              help="A task+URL that finished at least AGE ago (90s, 15m, 6h, 7d) is queued again instead "
                   "of counting as a duplicate. Default: CELERY_HA_DEDUP_TTL (unset: never).")
@click.option("--max-attempts", type=click.IntRange(1, 1000), help="Failures before a task goes to dead.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=SCRIPT_BATCH, show_default=True,
              help="URLs per Redis round trip.")
@click.option("--pump/--no-pump", default=True, show_default=True,
              help="Ask a live worker to dispatch the new tasks now (else the next sweep does).")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@pass_cli
def command(obj: CLIContext, urls: tuple[str, ...], source: IO[bytes] | None, sitemaps: tuple[str, ...],
            include: tuple[str, ...], exclude: tuple[str, ...], task: str,
            allow_unknown_task: bool, priority: int,
            meta_json: str | None, no_dedup: bool, recrawl_after: str | None, max_attempts: int | None,
            batch_size: int, pump: bool, as_json: bool) -> None:
    """Queue URLs for crawling: `enqueue URL...`, `enqueue -f FILE` or `enqueue --sitemap URL`.

    Every URL is checked before anything is written (a bad line names its number and nothing is
    queued). With dedup (the default) a task+URL already known is counted as a duplicate; one that
    finished longer ago than --recrawl-after (or CELERY_HA_DEDUP_TTL) is queued again and counted new.

    --sitemap streams the sitemap's pages in batches of --batch-size: a page whose task finished and
    whose <lastmod> is not newer than that is skipped as unchanged, one with a newer lastmod is queued
    again. --include/--exclude are globs (*, ?, [...]) on the page URL. A sitemap that cannot be read
    stops with one error line; the batches queued before it stay queued.
    """
    if not urls and source is None and not sitemaps:
        raise click.UsageError("give URLs as arguments, a file with -f FILE (-f - reads stdin) "
                               "or --sitemap URL")
    if sitemaps and (urls or source is not None):
        raise click.UsageError("--sitemap cannot be combined with URL arguments or -f")
    if (include or exclude) and not sitemaps:
        raise click.UsageError("--include/--exclude filter the pages of --sitemap")
    try:
        check_task_name(task)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--task") from None
    if not allow_unknown_task:
        known = known_task_names(obj.client, obj.namespace, max_age=obj.settings.lease_ttl)
        if known is not None and task not in known:
            raise click.BadParameter(f"the live workers of namespace {obj.namespace!r} do not run {task!r} "
                                     f"(they run {', '.join(sorted(known)) or 'nothing'}); "
                                     "--allow-unknown-task queues it anyway", param_hint="--task")
    if recrawl_after is not None:
        try:
            parse_duration(recrawl_after, "age")
        except InvalidInput as exc:
            raise click.BadParameter(str(exc), param_hint="--recrawl-after") from None
    meta = _meta(meta_json)
    dedup = not no_dedup
    if sitemaps:
        counts = _sitemaps(obj, sitemaps, include, exclude, task, priority, meta, dedup, recrawl_after,
                           max_attempts, batch_size)
        kicked = _kick(obj, counts.new, pump)
        if as_json:
            echo_json({"namespace": obj.namespace, "task": task, "sitemaps": list(sitemaps),
                       **counts.as_dict(), "pumped": kicked})
        else:
            click.echo(f"queued {counts.new} new task(s) ({counts.changed} changed since they finished), "
                       f"{counts.duplicates} duplicate(s), {counts.unchanged} unchanged, "
                       f"{counts.filtered} filtered, {counts.invalid} invalid, from {counts.documents} "
                       f"document(s) (task {task}, namespace {obj.namespace})")
        return
    lines = _checked_urls(urls, source)
    new = 0
    with click.progressbar(length=len(lines), label="queueing", file=sys.stderr,
                           hidden=source is None or not sys.stderr.isatty()) as bar:
        for start in range(0, len(lines), batch_size):
            batch = lines[start:start + batch_size]
            specs = [{"url": u, "task": task, "priority": priority, "meta": meta, "dedup": dedup,
                      "max_attempts": max_attempts} for u in batch]
            results = obj.queue.enqueue_many_with_status(specs, batch_size=batch_size,
                                                         recrawl_after=recrawl_after)
            new += sum(1 for _, created in results if created)
            bar.update(len(batch))
    kicked = _kick(obj, new, pump)
    result = {"namespace": obj.namespace, "task": task, "submitted": len(lines), "new": new,
              "duplicates": len(lines) - new, "pumped": kicked}
    if as_json:
        echo_json(result)
    else:
        click.echo(f"queued {new} new task(s), {len(lines) - new} duplicate(s) "
                   f"(task {task}, namespace {obj.namespace})")


def _kick(obj: CLIContext, new: int, pump: bool) -> bool:
    return bool(new and pump and kick(obj))


def _progress(counts: IngestCounts) -> str:
    return (f"\rsitemaps: {counts.documents} document(s), {counts.seen} URL(s): {counts.new} new, "
            f"{counts.duplicates} duplicate, {counts.unchanged} unchanged, {counts.filtered} filtered")


def _sitemaps(obj: CLIContext, sitemaps: tuple[str, ...], include: tuple[str, ...],
              exclude: tuple[str, ...], task: str, priority: int, meta: dict[str, Any] | None, dedup: bool,
              recrawl_after: str | None, max_attempts: int | None, batch_size: int) -> IngestCounts:
    """Stream the sitemaps into the queue; a terminal's stderr shows the running counts. A failure
    says how much was queued before it (those batches stay)."""
    for url in sitemaps:
        try:
            check_url(url)
        except InvalidInput as exc:
            raise click.BadParameter(f"{url!r}: {exc}", param_hint="--sitemap") from None
    live = sys.stderr.isatty()

    def show(_position: list[int], counts: IngestCounts) -> None:
        if live:
            click.echo(_progress(counts), file=sys.stderr, nl=False)

    ingest = SitemapIngest(obj.queue, task=task, priority=priority, meta=meta, dedup=dedup,
                           max_attempts=max_attempts, recrawl_after=recrawl_after,
                           url_filter=UrlFilter(include, exclude), batch_size=batch_size, on_batch=show)
    try:
        counts = ingest.run(list(sitemaps))
    except Exception as exc:  # an unexpected one too: the user still needs to know what stays queued
        if isinstance(exc, redis.RedisError):
            raise  # Redis itself failed: the CLI's own message and exit code say so
        if live:
            click.echo("", file=sys.stderr)
        done = ingest.counts
        what = str(exc) if isinstance(exc, CeleryHAError) else f"unexpected {type(exc).__name__}: {exc}"
        raise CeleryHAError(f"{what} (queued before it: {done.new} new, {done.duplicates} duplicate(s) "
                            f"in {done.seen} URL(s); complete batches stay queued)") from None
    finally:
        ingest.reader.close()
    if live:
        click.echo("", file=sys.stderr)
    reader = ingest.reader
    for skipped in reader.skipped_documents[:5]:
        click.echo(f"skipped sitemap {mask_url(skipped)}", err=True)
    if reader.skipped > 5:
        click.echo(f"skipped {reader.skipped - 5} more sitemap(s)", err=True)
    return counts
