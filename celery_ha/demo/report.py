"""The demo's closing report: what was crawled, what broke on purpose, and the verdict."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from celery_ha.demo.chaos import Failover
from celery_ha.demo.verify import Verification, reasons


@dataclass
class DemoReport:
    """Everything the report prints; ``as_dict`` is the machine-readable form (``--json``)."""

    verification: Verification
    elapsed: float
    stats: dict[str, Any]
    failovers: list[Failover]
    status_counts: dict[int, int]
    client_ips: int
    proxies: int
    workers_started: int
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verification.ok and not self.notes

    def failover_latencies(self) -> list[float]:
        return [f.latency for f in self.failovers if f.latency is not None]

    def as_dict(self) -> dict[str, Any]:
        v = self.verification
        lat = self.failover_latencies()
        return {
            "verified": self.ok, "elapsed_s": round(self.elapsed, 1),
            "pages": v.detail_items, "expected_pages": v.expected_pages, "list_items": v.list_items,
            "items": v.items, "duplicates": len(v.duplicates), "lost": len(v.lost),
            "unexpected": len(v.unexpected), "dead": len(v.dead), "dead_reasons": reasons(v.dead),
            "expected_dead": v.expected_dead,
            "reclaimed": int(self.stats.get("reclaimed", 0)), "released": int(self.stats.get("released", 0)),
            "retried": int(self.stats.get("retried", 0)),
            "reemits_absorbed": int(self.stats.get("items_duplicate", 0)),
            "failovers": len(self.failovers),
            "kills": [{"kind": f.kind, "victim": f.victim, "tasks_held": len(f.held),
                       "latency_s": None if f.latency is None else round(f.latency, 2)}
                      for f in self.failovers],
            "failovers_recovered": len(lat),
            "failover_latency_s": {"min": round(min(lat), 2), "median": round(statistics.median(lat), 2),
                                   "max": round(max(lat), 2)} if lat else None,
            "http_429": self.status_counts.get(429, 0),
            "http_status": {str(k): v for k, v in sorted(self.status_counts.items())},
            "client_ips": self.client_ips, "proxies": self.proxies, "workers_started": self.workers_started,
            "notes": self.notes, "warnings": self.warnings, "lost_examples": v.lost[:10],
            "duplicate_examples": v.duplicates[:10],
        }

    def render(self, console: Console) -> None:
        d = self.as_dict()
        table = Table(title="celery-ha demo report", show_header=False, title_style="bold")
        table.add_column(style="bold")
        table.add_column()
        lat = d["failover_latency_s"]
        rows: list[tuple[str, Any]] = [
            ("pages crawled", f"{d['pages']} of {d['expected_pages']} detail pages"),
            ("items in sink", f"{d['items']} ({d['list_items']} list entries + {d['pages']} pages)"),
            ("duplicates", d["duplicates"]),
            ("lost", d["lost"]),
            ("re-emits absorbed by the sink", d["reemits_absorbed"]),
            ("reclaimed (lease expired)", d["reclaimed"]),
            ("released (fast failover)", d["released"]),
            ("retried", d["retried"]),
            ("failovers", f"{d['failovers']} kills, {d['failovers_recovered']} recovered"),
            ("failover latency", "-" if not lat else
             f"min {lat['min']:.2f}s / median {lat['median']:.2f}s / max {lat['max']:.2f}s"),
            ("dead", f"{d['dead']} (expected {d['expected_dead']}: injected 404s)"),
            *[(f"  {count} x", reason) for reason, count in d["dead_reasons"].items()],
            ("429s seen", d["http_429"]),
            ("site answers", ", ".join(f"{k}: {v}" for k, v in d["http_status"].items())),
            ("client IPs seen by the site", f"{d['client_ips']} (proxies: {d['proxies']})"),
            ("workers started", d["workers_started"]),
            ("elapsed", f"{d['elapsed_s']:.1f}s"),
        ]
        for f in self.failovers:
            latency = "not recovered" if f.latency is None else f"{f.latency:.2f}s"
            rows.append((f"  killed {f.kind}", f"{f.victim} holding {len(f.held)} task(s): {latency}"))
        for key, value in rows:
            table.add_row(key, str(value))
        console.print(table)
        for example in d["lost_examples"]:
            console.print(f"[red]lost:[/red] {example}")
        for example in d["duplicate_examples"]:
            console.print(f"[red]duplicate:[/red] {example}")
        for warning in self.warnings:
            console.print(f"[yellow]note:[/yellow] {warning}")
        for note in self.notes:
            console.print(f"[red]problem:[/red] {note}")
        if self.ok:
            console.print("[bold green]VERIFIED: 0 lost, 0 duplicate items[/bold green]")
        else:
            console.print("[bold red]NOT VERIFIED[/bold red]")
