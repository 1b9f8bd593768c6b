"""Trace health, checked before anything is concluded from the traces."""

from __future__ import annotations

from datetime import datetime, timezone

from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.run.clocks import UNNAMED_HOST, Clocks
from diagtrain.profiler.analyzer.run.tables import Tables

# Checks that say some of the traced time is in no number: a report must not call such a run clean.
UNCOUNTED_CHECKS = ("unclassified", "device_time_unknown")


def check(tables: Tables, results: list[RankResult]) -> list[dict]:
    """Problems with the inputs, each ``{check, severity, message}``; empty when all is well."""
    notes = []

    def note(check: str, message: str, severity: str = "warning") -> None:
        notes.append({"check": check, "severity": severity, "message": message})

    ranks = {r.rank for r in results}
    world = tables.world_size
    if world and results and len(ranks) < world:
        missing = sorted(set(range(world)) - ranks)
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        note("missing_ranks", f"traces for {len(ranks)} of {world} ranks; missing: {shown}",
             "info" if len(ranks) < world / 2 else "warning")
    for field, label in (("steps", "profiled steps"), ("collectives", "collectives")):
        counts = {r.rank: len(getattr(r, field)) for r in results}
        if len(set(counts.values())) > 1:
            note(f"uneven_{field}", f"ranks traced different numbers of {label}: "
                 + ", ".join(f"rank {k}: {v}" for k, v in sorted(counts.items())[:16]))
    if results and not all(r.record_shapes for r in results):
        note("record_shapes", "record_shapes was off in some traces: collective sizes and bandwidth are unknown there", "info")
    if results and not all(r.profile_memory for r in results):
        note("profile_memory", "profile_memory was off in some traces: memory over time is not available from them", "info")
    for r in results:
        for message in r.health:
            note("events", f"rank {r.rank}: {message}")
        for n in r.notes:  # how the trace's events were read: unknown categories, departures from HTA
            note(n["check"], f"rank {r.rank}: {n['message']}", n["severity"])
        for message in r.warnings:
            note("rank_from_name", message, "info")
    notes += tables.notes  # found while reading the run directory: impossible values, repeated steps
    for w in tables.manifest.get("warnings") or []:  # diagtrain's own trouble while collecting
        if isinstance(w, dict):
            where = f"rank {w['rank']}" if "rank" in w else f"host {w.get('host')}"
            note("collection", f"{where}: {w.get('message')}")
    notes += [{"check": "clocks", "severity": severity, "message": message} for severity, message in _clock_notes(tables)]
    for host in tables.hosts:  # records that never ended: say what this analysis is missing
        if host.get("status") == "running":
            note("hosts", f"host {host.get('name')} is still running: this analysis covers what it wrote until now", "info")
        elif host.get("status") == "abandoned":
            seen = host.get("last_seen")
            when = datetime.fromtimestamp(seen, tz=timezone.utc).strftime("%H:%M:%S UTC") if seen else "?"
            note("hosts", f"host {host.get('name')}'s record never ended: its wrapper is gone (last seen {when}); "
                 "what it collected until then is analyzed")
    skew = _clock_skew(tables)
    if skew is not None and skew > Clocks.active().skew_ms:
        note("clocks", f"the same profiled step starts up to {skew:.0f} ms apart across ranks: clocks may not line up")
    return notes


def _clock_notes(tables: Tables) -> list[tuple[str, str]]:
    """How each host's clock was put on the reference host's, and hosts that could not be."""
    clocks = tables.host_clocks
    reference = next((h for h, c in clocks.items() if c.source == "reference"), None)
    reference = "the unnamed host of the lowest rank" if reference == UNNAMED_HOST else reference
    notes = []
    for host, c in sorted(clocks.items()):
        if c.source == "traces" and c.offset_s:
            if c.handshake_s is None:
                how = "from the end times of their shared collectives"
            elif c.offset_s == c.traces_s:
                how = (f"from the end times of their shared collectives, within the wrappers' handshake "
                       f"({c.handshake_s * 1e3:+.1f} ± {c.uncertainty_s * 1e3:.1f} ms)")
            else:
                how = (f"the nearest the wrappers' handshake allows ({c.handshake_s * 1e3:+.1f} ± "
                       f"{c.uncertainty_s * 1e3:.1f} ms) to what the end times of their shared collectives say "
                       f"({c.traces_s * 1e3:+.1f} ms)")
            notes.append(("info", f"host {host}: every time it recorded was moved by {c.offset_s * 1e3:+.1f} ms onto "
                          f"the clock of {reference}, {how}"))
        elif c.source == "handshake" and c.offset_s:
            via = f" (through {', '.join(c.via)})" if c.via else ""
            notes.append(("info", f"host {host}: every time it recorded was moved by {c.offset_s * 1e3:+.1f} ms "
                          f"(± {c.uncertainty_s * 1e3:.1f} ms) onto the clock of {reference}, from the wrappers' clock "
                          f"handshake{via}"))
        elif c.source == "none":
            notes.append(("warning", f"host {host}: nothing measured its clock against that of {reference} (no handshake, no "
                          "collectives shared in profiled steps): its times are taken as they are"))
    return notes


def _clock_skew(tables: Tables) -> float | None:
    steps = tables.steps
    if "trace_start" not in steps or steps["trace_start"].isna().all():
        return None
    spread = steps.dropna(subset=["trace_start"]).groupby("step")["trace_start"].agg(lambda s: s.max() - s.min())
    return float(spread.max() * 1e3) if len(spread) else None
