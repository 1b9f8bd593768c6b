"""What a person waits for in the dashboard's Timeline: measured in headless Chromium and on the server.

    python benchmarks/dashboard_speed.py [--sizes 8x200000,64x20000,1024x2000] [--reps 3] [--keep DIR]

For each size (ranks x events per rank), synthetic GPU-shaped traces (benchmarks/synthetic.py) are
analyzed once (``--keep DIR`` keeps and reuses them). Then:
- server: the timeline callback through Flask's test client (first figure in a fresh app, spans read
  from disk on first use; a zoom onto 1/20 of the run), and the response's size, plain and gzipped
  (the dashboard compresses its responses);
- browser: the app served on a loopback port to headless Chromium (1600x1000, WebGL by SwiftShader,
  no GPU): Timeline tab clicked -> lanes drawn, and a zoom onto 1/20 of the run -> the new figure
  drawn (both timed in the page, up to two animation frames after the figure is in place).
Medians of ``--reps``. Targets: first draw <= 1 s, zoom <= 300 ms, responses <= 500 KB.
The machine may be shared: its load average is recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import machine, run, save
from synthetic import trace_set

TARGET_FIRST_S, TARGET_ZOOM_S, TARGET_BYTES = 1.0, 0.3, 500_000
ZOOM_SHARE = 1 / 20  # the zoom onto a twentieth of the run (the measurement)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT_S = 120
TIMELINE = [("timeline", "figure"), ("timeline-status", "children")]


def callback(client, outputs, inputs, state, changed: str) -> tuple[float, dict, int, int]:
    """POST one callback request the way the browser does; (seconds, response, bytes, gzipped bytes)."""
    payload = {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + ".." if len(outputs) > 1 else f"{outputs[0][0]}.{outputs[0][1]}",
        "outputs": [{"id": i, "property": p} for i, p in outputs] if len(outputs) > 1 else
        {"id": outputs[0][0], "property": outputs[0][1]},
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "state": [{"id": i, "property": p, "value": v} for i, p, v in state],
        "changedPropIds": [changed],
    }
    started = time.perf_counter()
    response = client.post("/_dash-update-component", json=payload, headers={"Accept-Encoding": "identity"})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        sys.exit(f"callback {changed} failed: {response.status_code} {response.data[:500]!r}")
    return elapsed, json.loads(response.data), len(response.data), len(gzip.compress(response.data, 6))


def timeline_inputs(zoom: dict | None) -> list:
    return [("view", "data", None), ("timeline-zoom", "data", zoom), ("lanes", "value", []),
            ("timeline-reset", "n_clicks", 0), ("timeline-expand", "value", [])]


def server_side(folder: Path, reps: int) -> dict:
    """The timeline callback on the server: first figure (fresh app), zoom, and their sizes."""
    from diagtrain.dashboard import app, data

    firsts, zooms = [], []
    for _ in range(reps):
        client = app.build([data.load(folder)]).server.test_client()
        firsts.append(callback(client, TIMELINE, timeline_inputs(None), [("run", "value", 0)], "view.data"))
    end = float(data.load(folder).steps["end"].max())
    for k in range(reps):
        lo = end * (0.3 + 0.1 * k)
        zoom = {"xaxis.range[0]": lo, "xaxis.range[1]": lo + end * ZOOM_SHARE}
        zooms.append(callback(client, TIMELINE, timeline_inputs(zoom), [("run", "value", 0)], "timeline-zoom.data"))
    meta = firsts[-1][1]["response"]["timeline"]["figure"]["layout"]["meta"]
    zmeta = zooms[-1][1]["response"]["timeline"]["figure"]["layout"]["meta"]
    return {"first_s": [round(f[0], 3) for f in firsts], "zoom_s": [round(z[0], 3) for z in zooms],
            "first_bytes": firsts[-1][2], "first_gzip_bytes": firsts[-1][3],
            "zoom_bytes": max(z[2] for z in zooms), "zoom_gzip_bytes": max(z[3] for z in zooms),
            "first_level": meta["level"], "first_rows": len(meta["rows"]), "first_segments": meta["segments"],
            "zoom_level": zmeta["level"], "zoom_segments": zmeta["segments"], "end_s": end}


FIRST_DRAW = """
var done = arguments[arguments.length - 1];
var tab = Array.from(document.querySelectorAll('.tab')).find(function(e) { return e.textContent.trim() == 'Timeline'; });
var t0 = performance.now();
tab.click();
(function poll() {
    var g = document.querySelector('#timeline .js-plotly-plot');
    if (g && g.layout && g.layout.meta && g.layout.meta.level && g._fullLayout) {
        requestAnimationFrame(function() { requestAnimationFrame(function() { done(performance.now() - t0); }); });
    } else { setTimeout(poll, 5); }
})();
"""

ZOOM = """
var lo = arguments[0], hi = arguments[1], done = arguments[arguments.length - 1];
var g = document.querySelector('#timeline .js-plotly-plot');
var before = g.layout.meta;
var t0 = performance.now();
Plotly.relayout(g, {'xaxis.range': [lo, hi]});
(function poll() {
    if (g.layout.meta !== before && g.layout.meta.level) {
        requestAnimationFrame(function() { requestAnimationFrame(function() { done(performance.now() - t0); }); });
    } else { setTimeout(poll, 5); }
})();
"""


EMPTY_PLOT = """
var done = arguments[arguments.length - 1];
var div = document.createElement('div'); document.body.appendChild(div);
var t0 = performance.now();
Plotly.newPlot(div, [], {}).then(function() { var t = performance.now() - t0; Plotly.purge(div); div.remove(); done(t); });
"""


@contextmanager
def dashboard_in_chromium(folder: Path) -> Iterator[tuple[Any, Callable[[], None]]]:
    """The dashboard of ``folder`` served on a loopback port to headless Chromium (1600x1000, WebGL by SwiftShader,
    no GPU): yields the driver and a function that opens the page afresh and waits for its tabs."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from werkzeug.serving import make_server

    from diagtrain.dashboard import app, data

    server = make_server("127.0.0.1", 0, app.build([data.load(folder)]).server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(WAIT_S)

    def fresh_page() -> None:
        driver.get(f"http://127.0.0.1:{server.server_port}/")
        WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tab"))
        time.sleep(0.5)

    try:
        yield driver, fresh_page
    finally:
        driver.quit()
        server.shutdown()


def browser_errors(driver: Any) -> list[str]:
    """The page's severe console messages."""
    return [e["message"][:200] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def browser_side(folder: Path, reps: int, end: float) -> dict:
    """First draw and zoom as headless Chromium sees them, in ms."""
    firsts, zooms = [], []
    with dashboard_in_chromium(folder) as (driver, fresh_page):
        for k in range(reps):
            fresh_page()
            firsts.append(driver.execute_async_script(FIRST_DRAW))
            lo = end * (0.3 + 0.1 * k)
            zooms.append(driver.execute_async_script(ZOOM, lo, lo + end * ZOOM_SHARE))
        empty = [driver.execute_async_script(EMPTY_PLOT) for _ in range(reps)]  # the machine's state, in the page
        severe = browser_errors(driver)
    return {"first_ms": [round(x) for x in firsts], "zoom_ms": [round(x) for x in zooms],
            "empty_plot_ms": [round(x) for x in empty], "errors": severe}


def prepare(keep: Path, world: int, events: int) -> tuple[Path, float]:
    folder = keep / f"r{world}x{events}"
    if (folder / "report.json").exists():
        return folder, 0.0
    trace_set(folder, world, events)
    started = time.monotonic()
    run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(folder), "--format", "json", "--quiet",
         "--out", str(folder)])  # the dashboard reads the analysis from the folder it serves
    return folder, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8x200000,64x20000,1024x2000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the analyzed runs here and reuse them")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        keep = args.keep or Path(tmp)
        for world, events in sizes:
            folder, analyze_s = prepare(keep, world, events)
            load_before = os.getloadavg()[0]
            server = server_side(folder, args.reps)
            browser = browser_side(folder, args.reps, server["end_s"])
            results.append({"ranks": world, "events_per_rank": events, "analyze_s": round(analyze_s, 1),
                            "load_avg_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                            "server": server, "browser": browser})
            print(json.dumps(results[-1]), flush=True)
    m = machine()
    save("dashboard_speed", {"machine": m, "results": results}, markdown(m, results, args.reps))
    print(markdown(m, results, args.reps))


def markdown(m: dict, results: list[dict], reps: int) -> str:
    def ok(value: float, target: float) -> str:
        return f"**{value:,.0f}**" if value <= target else f"**{value:,.0f}** (over)"

    lines = []
    for r in results:
        s, b = r["server"], r["browser"]
        first, zoom = statistics.median(b["first_ms"]), statistics.median(b["zoom_ms"])
        biggest = max(s["first_bytes"], s["zoom_bytes"])
        biggest_gz = max(s["first_gzip_bytes"], s["zoom_gzip_bytes"])
        lines.append(f"| {r['ranks']:,} x {r['events_per_rank']:,} | {ok(first, TARGET_FIRST_S * 1e3)} "
                     f"({', '.join(map(str, b['first_ms']))}) | {ok(zoom, TARGET_ZOOM_S * 1e3)} "
                     f"({', '.join(map(str, b['zoom_ms']))}) | {statistics.median(s['first_s']) * 1e3:.0f} / "
                     f"{statistics.median(s['zoom_s']) * 1e3:.0f} | {biggest / 1e3:,.0f} KB / {biggest_gz / 1e3:,.0f} KB"
                     f" | {s['first_level']}, {s['first_rows']} rows | {r['load_avg_1min'][0]} → {r['load_avg_1min'][1]}"
                     f" | {statistics.median(b['empty_plot_ms']):.0f} |")
    return f"""# Dashboard: the Timeline in the browser and on the server

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}, diagtrain {m['diagtrain']}.
Command: `{m['command']}`. Headless Chromium 1600x1000, WebGL by SwiftShader (software, no GPU).
**This machine is shared with other jobs** (the load average, 1 min, before → after each size is
recorded in the last column; 2 cores): the numbers are upper bounds of an idle machine's.
Medians of {reps} (each value in brackets). Browser times: Timeline tab clicked (first draw) or
Plotly zoom onto 1/20 of the run, until the server's figure is drawn (two animation frames after).
Server: the timeline callback alone (first in a fresh app, spans read from disk; zoom), ms.
Sizes: the largest timeline response, plain / gzipped (the dashboard sends it gzipped).
"empty plot": Plotly drawing an empty figure in the same page, a gauge of how busy the machine was
(a few ms when it is idle). The first of each size's first draws is cold: the app reads the spans
from disk and the page parses plotly.js for the first time.

For reference, issue 24 measured the timeline before this design on an idle machine: first draw
1,086 ms (8 x 200k) and 2,465 ms (64 x 20k), zoom 222 ms and 4,219 ms, largest response 327 KB and
2.98 MB (uncompressed); 1,024 ranks could not be shown as a first view.

| ranks x events | first draw, ms (target 1,000) | zoom, ms (target 300) | server first / zoom, ms | largest response | first view | load avg | empty plot, ms |
| --- | ---: | ---: | ---: | ---: | --- | --- | ---: |
{chr(10).join(lines)}

Synthetic traces have 5 steps, so the whole run is already at the `spans` level (operators of
profiled steps). Up to {16} ranks every rank has a lane; beyond, ranks are grouped into at most 16 rows
drawn as images (what most ranks do, and the slowest rank), with ranks named by findings on lanes of their own.
"""


if __name__ == "__main__":
    main()
