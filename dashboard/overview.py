"""Overview: what the run was, and what the analysis found, most severe first."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from diagtrain.dashboard.data import RunData
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES
from diagtrain.profiler.analyzer.report import job_bar
from diagtrain.profiler.analyzer.report.sections import goodput_line
from diagtrain.profiler.analyzer.report.wording import saving_text
from diagtrain.profiler.util.text import ranges


def facts(run: RunData) -> list[tuple[str, str]]:
    """(label, value) pairs: command, strategy and mesh, ranks, hosts, steps, status."""
    r = run.report.get("run", {})
    mesh = r.get("mesh") or {}
    found = [
        ("run", str(run.path)),
        ("status", str(r.get("status") or "unknown")),
        ("command", " ".join(r.get("command") or []) or "(traces only)"),
        ("strategy", str(r.get("strategy") or "not a reference trainer")),
        ("mesh", " × ".join(f"{k} {v}" for k, v in mesh.items()) if mesh else "n/a"),
        ("ranks", str(r.get("world_size") or len(run.lanes))),
        ("hosts", ", ".join(h for h in r.get("hosts") or [] if h) or ", ".join(sorted({lane.host for lane in run.lanes})) or "?"),
        ("steps", str(r.get("steps", 0))),
        ("traces", "read when the job ends and is analyzed" if run.live is not None else
         "GPU (kernels)" if r.get("on_gpu") else "CPU (host ops)"),
        ("first step", datetime.fromtimestamp(run.t0, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if run.t0 else "?"),
    ]
    injected = r.get("injected") or []
    if injected:
        found.append(("injected faults", "; ".join(_fault(f) for f in injected)))
    found.append(("settings", settings_text(run.report)))
    return found


def settings_text(report: dict[str, Any]) -> str:
    """The thresholds a report was judged with, in one line: the defaults, or what was changed."""
    changed = (report.get("settings") or {}).get("overridden") or {}
    if not report.get("settings"):
        return "not recorded (analyzed before settings existed)"
    return "defaults" if not changed else "changed: " + ", ".join(f"{k}={v}" for k, v in changed.items())


def ordered_findings(run: RunData) -> list[tuple[int, dict[str, Any]]]:
    """(index in report.json, finding), most severe first, then by impact."""
    indexed = list(enumerate(run.findings))
    # SEVERITIES runs from info up; a severity it does not know sorts last.
    return sorted(indexed, key=lambda p: (-SEVERITIES.index(p[1]["severity"]) if p[1]["severity"] in SEVERITIES else 1,
                                          -(p[1].get("impact_ms") or 0.0), p[0]))


def where(finding: dict[str, Any]) -> str:
    """``ranks 1, 3 · steps 3-6`` for a finding."""
    parts = []
    if finding.get("ranks"):
        parts.append(f"rank{'s' if len(finding['ranks']) > 1 else ''} {ranges(finding['ranks'])}")
    if finding.get("steps"):
        parts.append(f"step{'s' if len(finding['steps']) > 1 else ''} {ranges(finding['steps'])}")
    if saving_text(finding):
        parts.append(saving_text(finding))
    return " · ".join(parts)


def _fault(f: dict[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in (f.get("params") or {}).items())
    rank = f" rank {f['rank']}" if f.get("rank") is not None else ""
    return f"{f['kind']}{rank}" + (f" ({params})" if params else "")


def goodput(report: dict[str, Any]) -> tuple[str, Any]:
    """The job's goodput in one line and its wall time by category as a bar; ("", None) without them."""
    section = report.get("job_time")
    return goodput_line(section), job_bar.figure(section)


def time_lost(report: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The ledger's "where the time went": a sentence on the run, and a row per cause (rank and part,
    when, seconds lost, per step, share of the run); ("", []) for a run without a ledger."""
    ledger = report.get("ledger") or {}
    if not ledger.get("steady_steps"):
        return "", []
    head = (f"{ledger['steady_steps']} steady steps, {ledger['job_s']:.2f} s of job time; "
            f"{ledger['waiting_s']:.2f} s blocked in collectives in all (noise {ledger['noise_ms']:.1f} ms).")
    rows = [[f"rank {c['rank']}, {c['part']}", c["pattern"] if c["pattern"] != "intermittent" else f"steps {ranges(c['steps'])}",
             f"{c['lost_s']:.2f} s", f"{c['per_step_ms']:.1f} ms", f"{c['share']:.0%}"] for c in ledger.get("causes") or []]
    return head, rows
