"""Server time of the dashboard: the first render and a zoom, on 8 ranks x 200,000 events.

    python benchmarks/dashboard_speed.py [--ranks 8] [--events 200000] [--reps 5]

Synthetic GPU-shaped traces (benchmarks/synthetic.py) are analyzed once; then the Dash app is
driven through Flask's test client, so each time is a whole request on the server: the callback
and the JSON it sends. First render: the page, the overview, the timeline tab and its first
figure, in a fresh app (spans read from disk on first use). Zoom: the timeline callback for a
drag-zoom onto a fifth of a step (the real spans), with the spans already in memory.
Targets: first render <= 1 s, zoom <= 300 ms; the browser gets <= 50,000 segments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, run, save
from synthetic import trace_set

TARGET_FIRST_S, TARGET_ZOOM_S = 1.0, 0.3


def callback(client, outputs: list[tuple[str, str]], inputs: list[tuple[str, str, object]],
             state: list[tuple[str, str, object]], changed: str) -> tuple[float, dict]:
    """POST one callback request the way the browser does; (seconds, response)."""
    payload = {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + ".." if len(outputs) > 1 else f"{outputs[0][0]}.{outputs[0][1]}",
        "outputs": [{"id": i, "property": p} for i, p in outputs] if len(outputs) > 1 else
        {"id": outputs[0][0], "property": outputs[0][1]},
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "state": [{"id": i, "property": p, "value": v} for i, p, v in state],
        "changedPropIds": [changed],
    }
    started = time.perf_counter()
    response = client.post("/_dash-update-component", json=payload)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        sys.exit(f"callback {changed} failed: {response.status_code} {response.data[:500]!r}")
    return elapsed, json.loads(response.data)


TIMELINE = [("timeline", "figure"), ("timeline-status", "children")]


def timeline_inputs(relayout: dict | None) -> list:
    return [("view", "data", None), ("timeline", "relayoutData", relayout), ("lanes", "value", []),
            ("timeline-reset", "n_clicks", 0)]


def first_render(folder: Path) -> dict:
    """A fresh app: load the run, serve the page, the overview, the timeline tab and its figure."""
    from diagtrain.dashboard import app, data

    started = time.perf_counter()
    dash_app = app.build([data.load(folder)])
    client = dash_app.server.test_client()
    load_s = time.perf_counter() - started
    times = {}
    t0 = time.perf_counter()
    assert client.get("/").status_code == 200
    client.get("/_dash-layout")
    client.get("/_dash-dependencies")
    times["page"] = time.perf_counter() - t0
    times["overview"], _ = callback(client, [("page", "children")], [("tabs", "value", "overview"), ("run", "value", 0)],
                                    [], "tabs.value")
    times["timeline tab"], _ = callback(client, [("page", "children")], [("tabs", "value", "timeline"),
                                                                         ("run", "value", 0)], [], "tabs.value")
    times["timeline figure"], response = callback(client, TIMELINE, timeline_inputs(None), [("run", "value", 0)],
                                                  "view.data")
    meta = response["response"]["timeline"]["figure"]["layout"]["meta"]
    return {"load_s": load_s, "parts_s": times, "server_s": sum(times.values()), "level": meta["level"],
            "segments": meta["segments"], "client": client}


def zoom(client, x0: float, x1: float) -> tuple[float, dict]:
    relayout = {"xaxis.range[0]": x0, "xaxis.range[1]": x1}
    elapsed, response = callback(client, TIMELINE, timeline_inputs(relayout), [("run", "value", 0)], "timeline.relayoutData")
    return elapsed, response["response"]["timeline"]["figure"]["layout"]["meta"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = trace_set(Path(tmp) / "traces", args.ranks, args.events)
        started = time.monotonic()
        run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(folder), "--format", "json", "--quiet"])
        analyze_s = time.monotonic() - started
        firsts = [first_render(folder) for _ in range(args.reps)]
        first = firsts[-1]
        from diagtrain.dashboard import data

        steps = data.load(folder).steps
        one = steps[steps["step"] == 3].iloc[0]
        width = (one["end"] - one["start"]) / 5
        zooms = [zoom(first["client"], one["start"] + i * width / 10, one["start"] + i * width / 10 + width)
                 for i in range(args.reps)]
        whole = zoom(first["client"], 0.0, float(steps["end"].max()))
    first_s = statistics.median(f["server_s"] for f in firsts)
    zoom_s = statistics.median(z[0] for z in zooms)
    m = machine()
    parts = "\n".join(f"| {name} | {statistics.median(f['parts_s'][name] for f in firsts) * 1e3:.0f} ms |"
                      for name in firsts[0]["parts_s"])
    result = {"machine": m, "ranks": args.ranks, "events_per_rank": args.events, "analyze_s": round(analyze_s, 2),
              "load_s": [round(f["load_s"], 3) for f in firsts], "first_render_s": [round(f["server_s"], 3) for f in firsts],
              "first_level": first["level"], "first_segments": first["segments"],
              "zoom_s": [round(z[0], 3) for z in zooms], "zoom_segments": [z[1]["segments"] for z in zooms],
              "whole_run_zoom_s": round(whole[0], 3), "whole_run_segments": whole[1]["segments"]}
    markdown = f"""# Dashboard server time

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}. Command: `{m['command']}`.
{args.ranks} ranks x {args.events:,} events (synthetic GPU-shaped traces), analyzed once ({analyze_s:.1f} s).
Requests through Flask's test client: callback plus JSON, medians of {args.reps}.

| | server time | target |
| --- | ---: | ---: |
| first render (page, overview, timeline tab, first figure) | **{first_s * 1e3:.0f} ms** | {TARGET_FIRST_S * 1e3:.0f} ms |
| zoom onto a fifth of a step (spans) | **{zoom_s * 1e3:.0f} ms** | {TARGET_ZOOM_S * 1e3:.0f} ms |
| zoom back to the whole run | {whole[0] * 1e3:.0f} ms | |

First render, by part:

| part | median |
| --- | ---: |
{parts}

Reading the run's analysis before the first request (not a request): {statistics.median(f['load_s'] for f in firsts) * 1e3:.0f} ms.
The first figure is at the `{first['level']}` level with {first['segments']:,} segments; a zoom sends
{statistics.median(result['zoom_segments']):,.0f}; the whole run at span level {whole[1]['segments']:,}
(budget {50_000:,}).
"""
    save("dashboard_speed", result, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
