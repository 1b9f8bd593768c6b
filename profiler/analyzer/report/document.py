"""report.md, report.json and report.html from the findings and tables."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.report import job_bar
from diagtrain.profiler.analyzer.report.critical_path_section import critical_path_lines
from diagtrain.profiler.analyzer.report.sections import expected_lines, job_time_lines, ledger_lines
from diagtrain.profiler.analyzer.report.wording import finding_json, saving_text
from diagtrain.profiler.analyzer.run.health import UNCOUNTED_CHECKS
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.run_dir import SCHEMA_VERSION, json_text, write_bytes_atomic
from diagtrain.profiler.util.bounded_read import display

FORMATS = ("md", "json", "html")
MAX_RANK_ROWS = 64  # longer rank tables are cut in the Markdown report (all ranks stay in JSON)



def build(run: Path, tables: Tables, findings: list[Finding], health: list[dict], skipped: list[dict]) -> dict[str, Any]:
    """The report.json document."""
    m = tables.manifest
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {"path": display(run), "status": m.get("status"), "command": m.get("command"),
                "strategy": m.get("strategy"), "mesh": m.get("mesh"), "world_size": tables.world_size,
                "hosts": [h.get("name") for h in m.get("hosts", [])], "injected": m.get("injected", []),
                "steps": int(tables.steps["step"].nunique()) if not tables.steps.empty else 0,
                "on_gpu": tables.on_gpu, "phases": tables.phases, "dumps": len(tables.dumps)},
        "structure": tables.structure.to_json(),
        "ranks": [_clean(r) for r in tables.ranks.to_dict("records")],
        "findings": [finding_json(f) for f in findings],
        "health": health,
        "skipped": skipped,
    }


def write(run_out: Path, report: dict[str, Any], formats: list[str], tables: Tables) -> list[Path]:
    """Write the asked formats next to the run; return the paths written."""
    written = []
    for fmt in formats:
        path = run_out / f"report.{fmt}"
        text = {"md": markdown, "json": lambda r: json_text(r, default=str) + "\n",
                "html": lambda r: html_page(r, tables)}[fmt](report)
        write_bytes_atomic(path, text.encode())
        written.append(path)
    return written


def markdown(report: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown that pastes well into an issue."""
    run = report["run"]
    lines = [f"## diagtrain report: `{run['path']}`", ""]
    facts = [f"status **{run['status']}**" if run.get("status") else None,
             f"strategy {run['strategy']}" if run.get("strategy") else None,
             f"mesh {run['mesh']}" if run.get("mesh") else None,
             f"{run['world_size']} ranks" if run.get("world_size") else None,
             *_evidence_read(run, report["ranks"])]
    lines += [", ".join(f for f in facts if f), ""]
    changed = (report.get("settings") or {}).get("overridden") or {}
    if changed:
        lines += ["Judged with changed settings (`--set`): " + ", ".join(f"`{k}={v}`" for k, v in changed.items())
                  + "; every other setting at its default (`diagtrain analyze --settings`).", ""]
    structure = report.get("structure") or {}
    if structure.get("lines"):
        lines += ["Parallel structure: " + "; ".join(structure["lines"]) + ".", ""]
    findings = report["findings"]
    lines += [f"### Findings ({len(findings)})", ""]
    uncounted = [h for h in report["health"] if h["check"] in UNCOUNTED_CHECKS]
    if not findings and uncounted:
        lines += [f"No problems found in the time that could be classified; {len(uncounted)} trace health "
                  "warning(s) below name the time that could not be.", ""]
    elif not findings:
        lines += ["No problems found.", ""]
    for i, f in enumerate(findings, 1):
        impact = f" · saves {saving_text(f)}" if saving_text(f) else ""
        lines += [f"{i}. **{f['severity'].upper()} {f['kind']}**{impact}: {f['explanation']}",
                  f"   - *What to do:* {f['suggestion']}",
                  f"   - *Thresholds:* {_thresholds(f['metrics'])}", ""]
    lines += job_time_lines(report.get("job_time"))
    lines += ledger_lines(report.get("ledger"))
    lines += critical_path_lines(report.get("critical_path"))
    lines += _rank_table(report["ranks"])
    lines += expected_lines(report.get("expected"))
    if report["health"]:
        lines += ["### Trace health", ""] + [f"- {h['severity']}: {h['message']}" for h in report["health"]] + [""]
    if report["skipped"]:
        lines += ["### Skipped inputs", ""] + [f"- `{s['path']}`: {s['reason']}" for s in report["skipped"]] + [""]
    return "\n".join(lines)


def _thresholds(metrics: dict[str, Any]) -> str:
    keys = [k for k in metrics if k.startswith(("threshold", "observed", "expected"))]
    return ", ".join(f"{k} = {_fmt(metrics[k])}" for k in keys) or "n/a"


def _evidence_read(run: dict[str, Any], ranks: list[dict]) -> list[str]:
    """What the analysis had to go on: steps and traces, or a folder of flight-recorder dumps alone."""
    if not run["steps"] and run.get("dumps") and not any(r.get("window_us") for r in ranks):
        return [f"flight-recorder dumps of {run['dumps']} ranks alone (no step records, no traces)"]
    return [f"{run['steps']} steps", "GPU traces" if run["on_gpu"] else "CPU traces"]


def _rank_table(ranks: list[dict]) -> list[str]:
    if not any(r.get("steps") or r.get("window_us") for r in ranks):
        return []
    lines = ["### Ranks", "",
             "Median step: over all recorded steps. Compute, non-compute and idle: summed over each rank's traced "
             "window (its profiled steps, first to last traced event), so together they make the window, not one step.",
             "",
             "| rank | steps | median step (ms) | profiled steps | traced window (ms) | compute in window (ms) "
             "| non-compute in window (ms) | idle in window (ms) | overlap | peak memory (MiB) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in ranks[:MAX_RANK_ROWS]:
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["rank"], r["steps"], _ms(r.get("step_time_median_us")), r.get("profiled_steps", ""), _ms(r.get("window_us")),
            _ms(r.get("compute_us")), _ms(r.get("non_compute_us")), _ms(r.get("idle_us")),
            "" if r.get("comm_comp_overlap_pct") is None else f"{r['comm_comp_overlap_pct']:.0f}%",
            "" if r.get("peak_mem_bytes") is None else f"{r['peak_mem_bytes'] / 2**20:.0f}"))
    if len(ranks) > MAX_RANK_ROWS:
        lines.append(f"| ... | {len(ranks) - MAX_RANK_ROWS} more ranks in report.json | | | | | | | | |")
    return lines + [""]


def html_page(report: dict[str, Any], tables: Tables) -> str:
    """A self-contained page: the Markdown content plus charts (plotly, inlined)."""
    import plotly.graph_objects as go
    from plotly.io import to_html

    figures = [f for f in (job_bar.figure(report.get("job_time")),) if f is not None]
    steps = tables.steps
    if not steps.empty:
        grid = steps.pivot_table(index="rank", columns="step", values="wall_ms")
        figures.append(go.Figure(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns), y=list(grid.index),
                                            colorbar={"title": "ms"}),
                                 layout={"title": "Step time per rank (ms)", "xaxis_title": "step", "yaxis_title": "rank"}))
    ranks = tables.ranks
    if not ranks.empty and ranks["compute_us"].notna().any():
        figures.append(go.Figure([go.Bar(name=n, x=ranks["rank"], y=ranks[c] / 1e3)
                                  for n, c in (("compute", "compute_us"), ("non-compute", "non_compute_us"), ("idle", "idle_us"))],
                                 layout={"barmode": "stack", "title": "Time per rank over its traced window (ms)",
                                         "xaxis_title": "rank"}))
    charts = "".join(to_html(fig, full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures))
    body = html.escape(markdown(report))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>diagtrain report</title></head>"
            f"<body style='font-family:sans-serif;max-width:1100px;margin:auto'><pre style='white-space:pre-wrap'>{body}</pre>"
            f"{charts}</body></html>")


def _ms(us: float | None) -> str:
    return "" if us is None or (isinstance(us, float) and math.isnan(us)) else f"{us / 1e3:.1f}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _clean(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}
