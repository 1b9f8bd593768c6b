"""The Steps tab's heatmap of a long run (issue 62): a million rank-steps drawn at a level of detail, and
a zoom down to single steps, measured in headless Chromium and on the server.

    python benchmarks/dashboard_steps.py [--ranks 2] [--steps 500000] [--reps 3] [--keep DIR]

A synthetic run (benchmarks/long_run.py's: rank 1 60 ms slower in forward from half-way) is analyzed once
(``--keep DIR`` keeps and reuses it). Server: the heatmap callback through Flask's test client, the whole
run and a zoom onto 20 steps around the straggler's onset (the relayout the zoom filter passes on), with the responses'
sizes. Browser: the app
served to headless Chromium (dashboard_speed.py's setup); the Steps tab clicked -> the heatmap drawn, then
``Plotly.relayout`` onto the 20 steps -> the finer figure drawn. Medians of ``--reps``. Targets as the
Timeline's: first draw <= 1 s, zoom <= 300 ms, responses <= 500 KB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, run, save  # noqa: E402
from dashboard_speed import (TARGET_BYTES, TARGET_FIRST_S, TARGET_ZOOM_S, browser_errors, callback,  # noqa: E402
                             dashboard_in_chromium)
from long_run import write_run  # noqa: E402

HEATMAP = [("heatmap", "figure")]
ZOOM_STEPS = 20

FIRST_DRAW = """
var done = arguments[arguments.length - 1];
var tab = Array.from(document.querySelectorAll('.tab')).find(function(e) { return e.textContent.trim() == 'Steps'; });
var t0 = performance.now();
tab.click();
(function poll() {
    var g = document.querySelector('#heatmap .js-plotly-plot');
    if (g && g.layout && g.layout.meta && g.layout.meta.steps && g._fullLayout) {
        requestAnimationFrame(function() { requestAnimationFrame(function() { done([performance.now() - t0, g.layout.meta]); }); });
    } else { setTimeout(poll, 5); }
})();
"""

ZOOM = """
var lo = arguments[0], hi = arguments[1], done = arguments[arguments.length - 1];
var g = document.querySelector('#heatmap .js-plotly-plot');
var t0 = performance.now();
Plotly.relayout(g, {'xaxis.range': [lo, hi]});
(function poll() {  // until the server's finer figure of the range is drawn (single steps, not binned)
    if (g.layout.meta && g.layout.meta.binned === false) {
        requestAnimationFrame(function() { requestAnimationFrame(function() { done([performance.now() - t0, g.layout.meta]); }); });
    } else { setTimeout(poll, 5); }
})();
"""


def heatmap_inputs(relayout: dict | None) -> list:
    return [("heatmap-metric", "value", "forward_ms"), ("heatmap-mode", "value", "relative"),
            ("heatmap-zoom", "data", relayout), ("live-version", "data", None)]


def server_side(folder: Path, reps: int, onset: int) -> dict:
    """The heatmap callback: the whole run and a zoom, seconds and bytes."""
    from diagtrain.dashboard import app, data

    client = app.build([data.load(folder)]).server.test_client()
    zoom = {"xaxis.range[0]": onset - ZOOM_STEPS / 2, "xaxis.range[1]": onset + ZOOM_STEPS / 2}  # as the filter passes it
    firsts = [callback(client, HEATMAP, heatmap_inputs(None), [("run", "value", 0)], "heatmap-metric.value")
              for _ in range(reps)]
    zooms = [callback(client, HEATMAP, heatmap_inputs(zoom), [("run", "value", 0)], "heatmap-zoom.data")
             for _ in range(reps)]
    meta = [r[1]["response"]["heatmap"]["figure"]["layout"]["meta"] for r in (firsts[-1], zooms[-1])]
    return {"first_s": [round(f[0], 3) for f in firsts], "zoom_s": [round(z[0], 3) for z in zooms],
            "first_bytes": firsts[-1][2], "first_gzip_bytes": firsts[-1][3], "zoom_bytes": zooms[-1][2],
            "zoom_gzip_bytes": zooms[-1][3], "first_meta": meta[0], "zoom_meta": meta[1]}


def browser_side(folder: Path, reps: int, onset: int) -> dict:
    """First draw and zoom as headless Chromium sees them, in ms."""
    firsts, zooms = [], []
    with dashboard_in_chromium(folder) as (driver, fresh_page):
        for _ in range(reps):
            fresh_page()
            firsts.append(driver.execute_async_script(FIRST_DRAW))
            zooms.append(driver.execute_async_script(ZOOM, onset - ZOOM_STEPS / 2, onset + ZOOM_STEPS / 2))
        severe = browser_errors(driver)
    return {"first_ms": [round(f[0]) for f in firsts], "zoom_ms": [round(z[0]) for z in zooms],
            "first_meta": firsts[-1][1], "zoom_meta": zooms[-1][1], "errors": severe}


def prepare(keep: Path, ranks: int, steps: int) -> tuple[Path, float]:
    """The analyzed run (reused from ``keep`` when there), and the seconds its analysis took."""
    folder = keep / f"r{ranks}x{steps}"
    if (folder / "report.json").exists():
        return folder, 0.0
    write_run(folder, ranks, steps)
    started = time.monotonic()
    run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(folder), "--format", "json", "--quiet",
         "--out", str(folder)])
    return folder, time.monotonic() - started


def markdown(m: dict, r: dict) -> str:
    """The results with their targets."""
    s, b = r["server"], r["browser"]
    first, zoom = statistics.median(b["first_ms"]), statistics.median(b["zoom_ms"])
    ok = lambda value, target: f"**{value:,.0f}**" + ("" if value <= target else " (over)")  # noqa: E731
    return (f"# Steps heatmap of a long run\n\n{m['date']}, {m['cpu_count']} cores, load {r['load_avg_1min']}, "
            f"`{m['command']}`\n\n{r['ranks']} ranks x {r['steps']:,} steps (analysis {r['analyze_s']} s). The whole "
            f"run: {s['first_meta']['steps']:,} steps in columns of a run of steps each (binned: "
            f"{s['first_meta']['binned']}); the zoom onto {ZOOM_STEPS} steps around the onset: single steps (binned: "
            f"{s['zoom_meta']['binned']}). Medians of {len(b['first_ms'])}.\n\n"
            "| | browser ms (target) | server s | response KB (gzip) |\n| --- | ---: | ---: | ---: |\n"
            f"| whole run, first draw | {ok(first, TARGET_FIRST_S * 1e3)} ({TARGET_FIRST_S * 1e3:.0f}) "
            f"| {statistics.median(s['first_s'])} | {s['first_bytes'] / 1e3:,.0f} ({s['first_gzip_bytes'] / 1e3:,.0f}) |\n"
            f"| zoom to {ZOOM_STEPS} steps | {ok(zoom, TARGET_ZOOM_S * 1e3)} ({TARGET_ZOOM_S * 1e3:.0f}) "
            f"| {statistics.median(s['zoom_s'])} | {s['zoom_bytes'] / 1e3:,.0f} ({s['zoom_gzip_bytes'] / 1e3:,.0f}) |\n\n"
            f"Response target: {TARGET_BYTES / 1e3:.0f} KB. Browser errors: {b['errors'] or 'none'}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the analyzed run here and reuse it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, analyze_s = prepare(args.keep or Path(tmp), args.ranks, args.steps)
        load_before, onset = os.getloadavg()[0], args.steps // 2 + 1
        result = {"ranks": args.ranks, "steps": args.steps, "analyze_s": round(analyze_s, 1),
                  "server": server_side(folder, args.reps, onset), "browser": browser_side(folder, args.reps, onset),
                  "load_avg_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    m = machine()
    print(json.dumps(result))
    save("dashboard_steps", {"machine": m, "result": result}, markdown(m, result))
    print(markdown(m, result))


if __name__ == "__main__":
    main()
