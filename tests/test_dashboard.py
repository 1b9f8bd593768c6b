"""The dashboard's views and callbacks on real analyzed runs, its level of detail, and its safety."""

from __future__ import annotations

import dataclasses
import gzip
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cluster_runs import cluster_run

from diagtrain.dashboard import (
    app,
    communication,
    compare,
    data,
    distribution,
    heatmap,
    memory,
    overview,
    rows,
    style,
    telemetry,
    timeline,
)
from diagtrain.dashboard.data import Lane, RunData, Spans
from diagtrain.profiler.compare import regression, report

USAGE = 2


def analyzed(run: Path) -> RunData:
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(run), "--quiet",
                           "--format", "json", "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return data.load(run)


@pytest.fixture(scope="module")
def straggler(dashboard_runs) -> RunData:
    return analyzed(dashboard_runs["straggler"])


@pytest.fixture(scope="module")
def clean(dashboard_runs) -> RunData:
    return analyzed(dashboard_runs["clean"])


def the_straggler(run: RunData) -> int:
    [index] = [i for i, f in enumerate(run.findings) if f["kind"] == "straggler"]
    return index


@pytest.mark.jobs
def test_run_data_lanes_and_times(straggler):
    assert [lane.rank for lane in straggler.lanes] == [0, 1, 2, 3]
    assert all(lane.label.endswith(f"r{lane.rank}") for lane in straggler.lanes)
    assert straggler.steps["start"].min() == pytest.approx(0.0)  # x = 0 is the first step
    assert straggler.phases[:2] == ["data", "forward"]
    spans = straggler.spans(2)
    assert spans.count() > 100 and set(spans.start) == {"compute", "comm", "memory", "idle"}
    profiled = straggler.steps[(straggler.steps["rank"] == 2) & straggler.steps["profiled"]]
    # Spans lie inside the profiled steps (one clock for steps and traces).
    assert spans.start["compute"].min() >= profiled["start"].min() - 0.05
    assert spans.end["compute"].max() <= profiled["end"].max() + 0.05


def test_mesh_coordinates_label_3d_lanes():
    mesh = {"pp": 2, "dp": 2, "tp": 2}
    assert [data.mesh_coordinate(r, mesh) for r in (0, 3, 5, 7)] == ["pp0 dp0 tp0", "pp0 dp1 tp1", "pp1 dp0 tp1",
                                                                     "pp1 dp1 tp1"]
    assert data.mesh_coordinate(3, {"pp": 1, "dp": 4, "tp": 1}) == ""  # one dimension: the rank says it all


def test_a_users_device_mesh_labels_lanes():
    # What the analysis infers from a plain 2D script's process groups (report.json's structure).
    structure = {"mesh": {"dp": 2, "tp": 2}, "mesh_source": "process groups",
                 "coords": {"2": {"dp": 1, "tp": 0}, "3": {"dp": 1, "tp": 1}}}
    assert data.structure_coordinate(2, structure) == "dp1 tp0"
    steps = pd.DataFrame({"rank": [2, 3], "step": [1, 1]})
    assert [lane.label for lane in data.lanes({"structure": structure}, steps, {})] == ["r2 dp1 tp0", "r3 dp1 tp1"]


@pytest.mark.jobs
def test_timeline_zoomed_out_is_step_blocks_on_every_rank(straggler):
    fig = timeline.figure(straggler, timeline.full_window(straggler))
    meta = fig["layout"]["meta"]
    assert meta["level"] == "steps" and meta["ranks"] == [0, 1, 2, 3]
    assert {t["name"] for t in fig["data"]} >= {"forward", "backward", "optimizer", "step start"}
    assert fig["layout"]["yaxis"]["ticktext"] == [lane.label for lane in straggler.lanes]
    assert meta["segments"] == len(straggler.steps) * len(straggler.phases) - _empty_phases(straggler)


def _empty_phases(run: RunData) -> int:
    return int(sum((run.steps[f"{p}_ms"].fillna(0) <= 0).sum() for p in run.phases))


@pytest.mark.jobs
def test_timeline_zoomed_in_shows_the_spans_of_profiled_steps(straggler):
    s = straggler.steps
    window = timeline.Window(float(s[s["step"] == 4]["start"].min()), float(s[s["step"] == 5]["end"].max()))
    fig = timeline.figure(straggler, window)
    names = {t["name"] for t in fig["data"]}
    assert fig["layout"]["meta"]["level"] == "spans" and {"compute", "comm", "idle"} <= names
    assert fig["layout"]["xaxis"]["range"] == [window.x0, window.x1]
    compute = next(t for t in fig["data"] if t["name"] == "compute")
    assert any(label.startswith("aten::") for label in compute["text"])  # hover names the op
    # The critical path of a zoomed-in step runs along the straggler's lane through its forward.
    path = next(t for t in fig["data"] if t["name"].startswith("critical path"))
    assert 2 in path["y"] and any(text.startswith("rank 2 forward") for text in path["hovertext"])


def test_level_of_detail_keeps_the_browser_under_its_budget():
    run = synthetic_run(ranks=4, spans_per_rank=200_000)
    whole = timeline.figure(run, timeline.Window(0.0, 2.0))  # 2 steps in view: spans level
    assert whole["layout"]["meta"]["level"] == "spans"
    assert 0 < whole["layout"]["meta"]["segments"] <= timeline.MAX_SEGMENTS
    narrow = timeline.figure(run, timeline.Window(0.5, 0.5002))  # 200 µs: every span, none merged
    raw = sum(int(((s.end["compute"] > 0.5) & (s.start["compute"] < 0.5002)).sum()) for s in run._spans.values())
    assert narrow["layout"]["meta"]["segments"] == raw > 0
    only_two = timeline.figure(run, timeline.Window(0.0, 2.0, ranks=[1, 3]))
    assert only_two["layout"]["meta"]["ranks"] == [1, 3]


def test_spans_closer_than_a_pixel_merge_and_say_how_many():
    starts, ends = np.array([0.0, 1.5, 10.0, 10.2]), np.array([1.0, 2.0, 10.1, 10.25])
    names = np.array(["aten::mm", "aten::add", "allreduce", "aten::mul"])
    s, e, labels = timeline._coalesce(starts, ends, names, resolution=1.0)
    assert s.tolist() == [0.0, 10.0] and e.tolist() == [2.0, 11.0]  # the second is widened to one pixel
    assert labels.tolist() == ["aten::mm and 1 more", "allreduce and 1 more"]
    s, e, labels = timeline._coalesce(starts, ends, names, resolution=0.01)
    assert len(s) == 4 and labels.tolist() == names.tolist()


def synthetic_run(ranks: int, spans_per_rank: int) -> RunData:
    """Back-to-back 5 µs compute spans, 5 µs apart, over two 1-second steps per rank."""
    starts = np.arange(spans_per_rank) * 1e-5
    spans = {r: Spans({"compute": starts, "comm": np.empty(0), "memory": np.empty(0), "idle": np.empty(0)},
                      {"compute": starts + 5e-6, "comm": np.empty(0), "memory": np.empty(0), "idle": np.empty(0)},
                      {"compute": np.full(spans_per_rank, "aten::mm"), "comm": np.empty(0, dtype=str),
                       "memory": np.empty(0, dtype=str), "idle": np.empty(0, dtype=str)}) for r in range(ranks)}
    steps = pd.DataFrame([{"rank": r, "step": s, "start": s - 1.0, "end": float(s), "wall_ms": 1000.0, "profiled": True}
                          for r in range(ranks) for s in (1, 2)])
    run = RunData(path=Path("synthetic"), report={"findings": [], "run": {}}, steps=steps, ranks=pd.DataFrame(),
                  collectives=pd.DataFrame(), telemetry=pd.DataFrame(), nccl={}, hang={}, timeline={"ranks": {}},
                  t0=0.0, lanes=[Lane(r, "host", f"r{r}") for r in range(ranks)])
    run._spans.update(spans)
    return run


@pytest.mark.jobs
def test_clicking_a_finding_opens_the_timeline_at_its_range(straggler):
    board = app.Dashboard([straggler])
    index = the_straggler(straggler)
    tab, view = board.open_finding({"type": "finding", "index": index}, [0] * index + [1], 0)
    lo, hi = timeline.finding_range(straggler, straggler.findings[index])
    assert tab == "timeline" and view["focus"] == index and view["x0"] < lo < hi < view["x1"]
    fig, status = board.update_timeline(None, view, None, None, 0)
    assert fig["layout"]["xaxis"]["range"] == [view["x0"], view["x1"]]
    focused = [s for s in fig["layout"]["shapes"] if s.get("line", {}).get("width") == 3]
    assert focused and {round(s["y0"] + 0.48) for s in focused} == {2}  # the straggler's lane, outlined
    assert "4 ranks" in status
    with pytest.raises(app.PreventUpdate):  # the page's first render clicks nothing
        board.open_finding({"type": "finding", "index": index}, [0] * len(straggler.findings), 0)


@pytest.mark.jobs
def test_zoom_reset_and_lane_choice_callbacks(straggler):
    board = app.Dashboard([straggler])
    zoomed, _ = board.update_timeline("timeline", None, {"xaxis.range[0]": 0.1, "xaxis.range[1]": 0.2}, None, 0)
    assert zoomed["layout"]["xaxis"]["range"] == [0.1, 0.2]
    reset, _ = board.update_timeline("timeline", None, {"xaxis.autorange": True}, None, 0)
    assert reset["layout"]["xaxis"]["range"] == [0.0, pytest.approx(straggler.end)]
    lanes, _ = board.update_timeline("lanes", None, None, [2, 0], 0)
    assert lanes["layout"]["meta"]["ranks"] == [0, 2]
    with pytest.raises(app.PreventUpdate):
        board.update_timeline("timeline", None, {"autosize": True}, None, 0)


def long_run(steps: int, slow_from: int) -> RunData:
    """A run of 2 ranks x ``steps`` (no job: the views read tables), rank 1 60 ms slower in forward from ``slow_from``."""
    step = np.tile(np.arange(1, steps + 1), 2)
    rank = np.repeat([0, 1], steps)
    forward = 20.0 + np.where((rank == 1) & (step >= slow_from), 60.0, 0.0)
    start = (step - 1) * 0.13  # seconds since t0
    table = pd.DataFrame({"rank": rank, "step": step, "start": start, "end": start + 0.13, "wall_ms": 130.0,
                          "forward_ms": forward})
    finding = {"kind": "straggler", "severity": "error", "ranks": [1], "steps": list(range(slow_from, steps + 1)),
               "metrics": {"quantity": "phase:forward"}}
    report = {"findings": [finding], "run": {"phases": ["forward"]}}
    empty = pd.DataFrame()
    return RunData(Path("."), report, table, empty, empty, empty, {}, {}, {}, 0.0,
                   lanes=[Lane(r, "host", f"r{r}") for r in (0, 1)])


def test_a_million_steps_heatmap_shows_a_level_of_detail_that_a_zoom_refines():
    run = long_run(500_000, 250_001)
    fig = heatmap.figure(run, "forward_ms", heatmap.RELATIVE)
    heat, marks = fig["data"][0], fig["data"][1]
    z = np.array(heat["z"], dtype=float)
    assert fig["layout"]["meta"] == {"marked": [1], "steps": 500_000, "binned": True}
    assert z.shape == (2, heatmap.MAX_STEP_COLUMNS) and "500,000 steps" in fig["layout"]["title"]["text"]
    x = np.array(heat["x"])
    # Rank 1 stands 30 ms above the two ranks' median (their mean) from its onset, level before it.
    assert np.allclose(z[1, x >= 250_001], 30.0) and np.allclose(z[1, x + 250 < 250_001], 0.0)
    assert set(marks["y"]) == {1} and min(marks["x"]) <= 250_001 < min(marks["x"]) + 250 and len(marks["x"]) == 1000
    assert heatmap.zoomed_range({"xaxis.range[0]": 249_990.5, "xaxis.range[1]": 250_010}) == (249_990.5, 250_010.0)
    assert heatmap.zoomed_range({"xaxis.autorange": True}) is None and heatmap.zoomed_range({"autosize": True}) is False
    board = app.Dashboard([run, long_run(100, 50)], None)
    assert board.update_heatmap("heatmap-zoom", "forward_ms", "relative", {"xaxis.range": [10, 20]}, 0)["data"][0]["x"] \
        == list(range(10, 21))
    for relayout, index in (({"autosize": True}, 0), ({"xaxis.range": [10, 20]}, 1)):  # not a zoom; a short run's own
        with pytest.raises(app.PreventUpdate):
            board.update_heatmap("heatmap-zoom", "forward_ms", "relative", relayout, index)
    zoomed = heatmap.figure(run, "forward_ms", heatmap.RELATIVE, (249_990.5, 250_010))
    heat = zoomed["data"][0]
    assert not zoomed["layout"]["meta"]["binned"] and heat["x"] == list(range(249_991, 250_011))
    assert [v for v in heat["z"][1]] == [0.0] * 10 + [30.0] * 10  # single steps again: the onset is step 250,001
    assert zoomed["data"][1]["x"] == list(range(250_001, 250_011))


def test_a_million_steps_timeline_draws_runs_of_steps_within_its_budget_and_single_steps_when_zoomed():
    run = long_run(500_000, 250_001)
    fig = timeline.figure(run, timeline.full_window(run))
    [blocks] = [t for t in fig["data"] if t["name"].startswith("steps (")]
    assert blocks["name"] == "steps (250 a block)" and fig["layout"]["meta"]["segments"] == 4000  # 2 lanes x 2,000
    assert "rank 1 steps 250001-250250: mean 130.0 ms" in blocks["text"]
    zoomed = timeline.figure(run, timeline.Window(1000.0, 1001.0))  # 8 steps a lane: each step its own block
    names = {t["name"] for t in zoomed["data"]}
    assert "forward" in names and not any(n.startswith("steps (") for n in names)


@pytest.mark.jobs
def test_steps_heatmap_marks_the_straggler(straggler):
    assert heatmap.default_metric(straggler) == "forward_ms"  # the finding's phase
    fig = heatmap.figure(straggler, "forward_ms", heatmap.RELATIVE)
    heat = fig["data"][0]
    z = np.array([[np.nan if v is None else v for v in row] for row in heat["z"]])
    assert heat["y"][int(np.nanargmax(np.nanmean(z, axis=1)))] == 2  # the hottest row is rank 2
    assert fig["layout"]["meta"]["marked"] == [2]
    marks = [t for t in fig["data"][1:] if t["name"].startswith("straggler")]
    assert marks and set(marks[0]["y"]) == {2}
    absolute = heatmap.figure(straggler, "wall_ms", heatmap.ABSOLUTE)
    assert absolute["data"][0]["zmid"] is None
    assert {o["value"] for o in heatmap.metrics(straggler)} >= {"wall_ms", "forward_ms", "compute_ms", "wait_ms"}


@pytest.mark.jobs
def test_communication_tables(straggler):
    rows, columns, note = communication.table(straggler, communication.SUMMARY)
    ops = {(r["op"], r["group"]) for r in rows}
    assert ("all_reduce", "default_pg") in ops and "collective calls" in note
    assert {c["id"] for c in columns} >= {"busbw_gbps", "wait_ms", "last_rank"}
    every, _, _ = communication.table(straggler, communication.PER_COLLECTIVE)
    assert len(every) == len(straggler.collectives)
    ddp = [r for r in rows if r["group"] == "default_pg"]
    assert max(ddp, key=lambda r: r["count"])["last_rank"] == 2  # everyone waits for the straggler
    assert communication.topology(straggler) == []  # gloo: no NCCL logs


@pytest.mark.jobs
def test_memory_shows_the_model_state_as_part_of_each_peak(straggler):
    fig = memory.peaks(straggler)
    state, rest, median = fig["data"]
    assert fig["layout"]["barmode"] == "stack" and state["x"] == rest["x"] == [0, 1, 2, 3]
    ranks = straggler.ranks.set_index("rank")
    expected = ranks["parameters"] * 16 / 2**20
    assert state["y"] == pytest.approx(expected.loc[state["x"]].round(2).tolist(), abs=0.01)
    peaks = (ranks["peak_mem_bytes"] / 2**20).loc[rest["x"]]
    assert [s + r for s, r in zip(state["y"], rest["y"])] == pytest.approx(peaks.tolist(), abs=0.02)  # the whole peak
    assert median["y"] == pytest.approx([peaks.median()] * 2) and median["name"] == f"median peak {peaks.median():.0f} MiB"
    # A state far too thin to see in the bar is written above it, with its share of the peak.
    assert all(t.startswith(f"state {s:.1f} MiB (") for t, s in zip(rest["text"], state["y"]))


@pytest.mark.jobs
def test_memory_over_time_has_one_legend_entry_per_kind(straggler):
    lines = memory.over_time(straggler)["data"]
    assert len(lines) == 8  # 4 ranks' step peaks and 4 ranks' RSS
    shown = [t["name"] for t in lines if t["showlegend"]]
    assert shown == ["step peak, all 4 ranks (hover for each)", "process RSS (telemetry), all 4 ranks (hover for each)"]
    assert {t["legendgroup"] for t in lines} == {"peak", "rss"}
    by_rank = {}
    for t in lines:  # a rank's two lines share its colour; the hover names the rank
        rank = int(t["hovertemplate"].split()[1])
        by_rank.setdefault(rank, set()).add(t["line"]["color"])
    assert sorted(by_rank) == [0, 1, 2, 3] and all(len(c) == 1 for c in by_rank.values())
    assert len({c for cs in by_rank.values() for c in cs}) == 4


@pytest.mark.jobs
def test_every_collective_group_is_named_or_its_absence_explained(pipeline_job):
    run = data.load(pipeline_job.out)
    rows, _, _ = communication.table(run, communication.SUMMARY)
    groups = {r["op"]: r["group"] for r in rows}
    # gloo's send/recv name only the peer; the analysis finds the group where both sides name each other.
    assert groups["send"] == groups["recv"] == "default_pg (point-to-point; group inferred from the peers)"
    assert groups["all_reduce"] == "metrics"
    assert run.report["structure"]["p2p_groups"]["1"]["ranks"] == [0, 1]
    assert not any(r["group"] in ("?", "nan", "None") for r in rows)
    # Where nothing names the group, the table says why.
    unknown = run.collectives.assign(pg="?", pg_desc=None)
    labels = communication.group_labels(dataclasses.replace(run, collectives=unknown, report={**run.report, "structure": {}}))
    p2p = unknown["is_p2p"].to_numpy()
    assert set(labels[p2p]) == {communication.UNKNOWN_P2P} and set(labels[~p2p]) == {communication.UNKNOWN_CPU}


@pytest.mark.jobs
def test_telemetry_view(straggler):
    assert telemetry.default_metric(straggler) == "cpu_percent"
    fig = telemetry.figure(straggler, "rss_bytes")
    assert {t["name"] for t in fig["data"]} >= {"rank 0", "rank 3"}
    assert "MiB" in fig["layout"]["title"]["text"]
    assert telemetry.figure(straggler, "no_such_metric")["layout"]["meta"]["empty"]


def test_telemetry_names_the_other_processes_on_a_host():
    run = synthetic_run(1, 1)
    run.telemetry = pd.DataFrame([
        {"t": 0.0, "kind": "host", "host": "vm", "cpu_percent": 100.0, "others_cpu_percent": 90.0},
        {"t": 0.0, "kind": "process", "host": "vm", "rank": 0, "cpu_percent": 60.0},
        {"t": 0.0, "kind": "other", "host": "vm", "pid": 4242, "name": "hog", "cpu_percent": 90.0}])
    assert {t["name"] for t in telemetry.figure(run, "cpu_percent")["data"]} == {"host vm", "rank 0", "hog (pid 4242) @ vm"}
    assert [t["name"] for t in telemetry.figure(run, "others_cpu_percent")["data"]] == ["host vm"]


@pytest.mark.jobs
def test_compare_view_shows_the_verdicts_of_diagtrain_compare(clean, straggler):
    board = app.Dashboard([clean, straggler])
    verdict, changes, fig, rows = board.update_compare(10)
    result = regression.compare([clean.summary()], straggler.summary(), 10)  # what `diagtrain compare` judges
    assert verdict.startswith(compare.verdict(result)) and verdict.lower().startswith(result.verdict)
    assert [(r["metric"], r["scope"], r["verdict"]) for r in rows] == \
        [(r.metric, r.scope, r.verdict) for r in report.shown(result)]
    # An 80 ms straggler: rank 2's forward leads (beyond x2.5 of one run: a regression; else inconclusive).
    assert (rows[0]["metric"], rows[0]["scope"]) == ("forward", "rank 2")
    assert rows[0]["verdict"] in ("regression", "inconclusive") and rows[0]["reason"]
    assert rows[0]["band"] == "-60%..+150% (1 run: assumed)"
    assert any("straggler on rank 2" in str(c.children) for c in changes)
    assert [t["name"].split(":")[0] for t in fig["data"]] == ["BASE", "NEW"]


@pytest.mark.jobs
def test_the_compare_tab_lists_what_the_cli_lists(clean, straggler):
    """Causes, notes and the findings by cause: the same lines as `diagtrain compare --format md`."""
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "compare", str(clean.path), str(straggler.path),
                           "--threshold", "10", "--format", "md"], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1, 3), proc.stderr
    listed = [line[2:].replace("**", "") for line in proc.stdout.splitlines() if line.startswith(("- ", "> "))]
    assert any(line.startswith("new: ") or line.startswith("worse") for line in listed)  # a findings diff to compare
    _, shown, _, _ = app.Dashboard([clean, straggler]).update_compare(10)
    shown = [str(item.children) for item in shown]
    assert [line for line in shown if line != compare.BY_CAUSE] == listed


@pytest.mark.jobs
def test_every_tab_renders(straggler, clean):
    board = app.Dashboard([clean, straggler])
    for tab, _ in app.TABS:
        assert board.render_tab(tab, 1) is not None
    assert board.run(7) is clean  # an index nobody gave is the first run, never a path


@pytest.mark.jobs
def test_the_server_serves_only_its_runs(straggler):
    dash_app = app.build([straggler])
    client = dash_app.server.test_client()
    assert client.get("/").status_code == 200
    assert not dash_app.server.debug
    for path in ("/_dash-component-suites/../../../../etc/passwd", "/assets/../../../../etc/passwd",
                 f"/{straggler.path}/report.json", "/ranks/0/stdout.log"):
        response = client.get(path)
        assert b"root:" not in response.data and b"schema_version" not in response.data, path
    # A callback asking for a run index that does not exist gets the first run, nothing else.
    payload = {"output": "heatmap.figure", "outputs": {"id": "heatmap", "property": "figure"},
               "inputs": [{"id": "heatmap-metric", "property": "value", "value": "wall_ms"},
                          {"id": "heatmap-mode", "property": "value", "value": "absolute"},
                          {"id": "heatmap-zoom", "property": "data", "value": None},
                          {"id": "live-version", "property": "data", "value": {"generation": 0}}],
               "state": [{"id": "run", "property": "value", "value": "/etc"}], "changedPropIds": ["heatmap-metric.value"]}
    response = client.post("/_dash-update-component", json=payload)
    assert response.status_code == 200
    figure = json.loads(response.data)["response"]["heatmap"]["figure"]
    assert figure["data"][0]["y"] == [0, 1, 2, 3]


@pytest.mark.jobs
def test_command_line_errors(tmp_path, straggler):
    def dashboard(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "dashboard", *args], capture_output=True,
                              text=True, timeout=60)

    missing = dashboard(str(tmp_path / "nope"))
    assert missing.returncode == USAGE and "nope: no such run directory" in missing.stderr
    assert dashboard(str(straggler.path), "--port", "70000").returncode == USAGE
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = dashboard(str(straggler.path), "--port", str(port))
    assert taken.returncode == USAGE and "already in use" in taken.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = dashboard(str(empty))  # analyzed first: nothing to read, so nothing to show
    assert nothing.returncode == USAGE and "empty" in nothing.stderr
    assert "127.0.0.1" in dashboard("--help").stdout


@pytest.mark.jobs
def test_requests_larger_than_the_limit_are_refused_unread(straggler):
    client = app.build([straggler]).server.test_client()
    body = b"{" + b" " * (app.MAX_REQUEST_BYTES + 1) + b"}"
    response = client.post("/_dash-update-component", data=body, content_type="application/json")
    assert response.status_code == 413
    assert client.get("/_dash-layout").status_code == 200  # the server still answers


@pytest.mark.jobs
@pytest.mark.parametrize("bound,header,allowed", [
    ("127.0.0.1", "127.0.0.1:8050", True), ("127.0.0.1", "localhost:8050", True), ("127.0.0.1", "LOCALHOST", True),
    ("127.0.0.1", "[::1]:8050", True), ("127.0.0.1", "attacker.example:8050", False),
    ("127.0.0.1", "127.0.0.1.attacker.example", False), ("10.1.2.3", "10.1.2.3:8050", True),
    ("10.1.2.3", "attacker.example", False), ("0.0.0.0", "any-name.internal:8050", True),
])
def test_a_page_served_under_another_name_is_refused(straggler, bound, header, allowed):
    """DNS rebinding: a page of attacker.example, re-pointed at 127.0.0.1, sends its own name as Host."""
    client = app.build([straggler], host=bound).server.test_client()
    for path in ("/", "/_dash-layout"):
        response = client.get(path, headers={"Host": header})
        assert (response.status_code == 200) == allowed, (path, response.status_code)
        if not allowed:
            assert response.status_code == 403 and b"schema_version" not in response.data


@pytest.mark.jobs
@pytest.mark.parametrize("threshold", ["5", -1, float("nan"), float("inf"), 1e9, True, [5], {"a": 1}])
def test_a_threshold_that_is_not_a_percentage_is_refused(clean, straggler, threshold):
    board = app.Dashboard([clean, straggler])
    verdict, changes, _fig, rows = board.update_compare(threshold)
    assert verdict.startswith("The threshold must be a number from 0 to 1000") and changes == [] and rows == []


@pytest.mark.jobs
def test_the_threshold_through_the_server(clean, straggler):
    client = app.build([clean, straggler]).server.test_client()
    payload = {"output": "..compare-verdict.children...compare-findings.children...compare-steps.figure..."
                         "compare-table.data..",
               "outputs": [{"id": i, "property": p} for i, p in (("compare-verdict", "children"),
                           ("compare-findings", "children"), ("compare-steps", "figure"), ("compare-table", "data"))],
               "inputs": [{"id": "compare-threshold", "property": "value", "value": "1e400"}],
               "changedPropIds": ["compare-threshold.value"]}
    response = client.post("/_dash-update-component", json=payload)
    assert response.status_code == 200
    assert "must be a number" in json.loads(response.data)["response"]["compare-verdict"]["children"]


@pytest.mark.jobs
def test_a_damaged_analysis_is_a_clear_error(straggler, tmp_path):
    run = tmp_path / "run"
    (run / "analysis").mkdir(parents=True)
    for name in data.REQUIRED:
        src = straggler.path / name
        (run / name).write_bytes(src.read_bytes())
    (run / "report.json").write_text("[]")
    with pytest.raises(data.RunError, match="report.json holds list"):
        data.load(run)
    (run / "report.json").write_bytes((straggler.path / "report.json").read_bytes())
    timeline_doc = json.loads((run / "analysis/timeline.json").read_text())
    for info in timeline_doc["ranks"].values():
        info["spans"] = "../../../../../../etc/passwd"  # not read: a traversal the dashboard must refuse
    (run / "analysis/timeline.json").write_text(json.dumps(timeline_doc))
    loaded = data.load(run)
    assert all(loaded.spans(lane.rank) is None for lane in loaded.lanes)  # never read outside analysis/


def test_a_big_job_is_grouped_with_the_ranks_findings_name_on_lanes_of_their_own():
    run = cluster_run(64, straggler=61)
    table = rows.rows(run)
    assert [r.label for r in table[:1]] == ["r61"] and not table[0].is_group
    groups = [r for r in table if r.is_group]
    assert len(groups) == 8 and sorted(r for g in groups for r in g.ranks) == [r for r in range(64) if r != 61]
    opened = rows.rows(run, expand=[groups[0].key])
    at = [r.label for r in opened].index(groups[0].label)
    assert [r.label for r in opened[at + 1:at + 9]] == [f"r{i}" for i in range(8)]  # its ranks, right below it
    assert [r.label for r in rows.rows(run, ranks=[3, 40])] == ["r3", "r40"]  # chosen ranks: lanes only
    assert all(not r.is_group for r in rows.rows(cluster_run(rows.MAX_RANK_LANES, straggler=0)))
    # Hosts first, then pipeline stages, then blocks of ranks.
    on_hosts = [Lane(r, f"node{r // 8}", f"node{r // 8} · r{r}") for r in range(32)]
    assert [g.label for g in rows.groups(run, on_hosts)] == [f"node{h} (8 ranks)" for h in range(4)]
    staged = [Lane(r, "vm", f"vm · r{r} {data.mesh_coordinate(r, {'pp': 4, 'dp': 2, 'tp': 4})}") for r in range(32)]
    assert [g.ranks for g in rows.groups(run, staged)] == [list(range(s * 8, s * 8 + 8)) for s in range(4)]
    assert rows.groups(run, staged)[0].label == "stage pp0 (8 ranks)"


def test_group_rows_show_what_most_ranks_do_and_the_slowest_rank():
    run = cluster_run(64, straggler=10, named=False)  # nothing pulls rank 10 out: its group must show it
    fig = timeline.figure(run, timeline.full_window(run))
    meta = fig["layout"]["meta"]
    assert meta["ranks"] == [] and meta["level"] == "steps"
    (heat,) = [t for t in fig["data"] if t["type"] == "heatmap"]  # one image for all group rows
    row = meta["rows"].index("ranks 8–15 (8 ranks)")
    top, bottom = heat["y"].index(row - 0.25), heat["y"].index(row + 0.25)
    at = int(np.argmin(np.abs(np.array(heat["x"]) - 0.15)))  # the others are in backward, rank 10 still forward
    assert heat["text"][top][at] == "backward on 7/8" and heat["text"][bottom][at] == "slowest: r10 forward"
    other = meta["rows"].index("ranks 0–7 (8 ranks)")
    assert heat["text"][heat["y"].index(other + 0.25)][at].endswith("backward")  # no straggler there
    legend = {t["name"] for t in fig["data"] if t.get("showlegend")}
    assert {"forward", "backward", "optimizer", "profiler export"} <= legend
    # Zoomed in to the profiled step 4 of the others: their spans; rank 10 is still in its step 3's forward.
    fig = timeline.figure(run, timeline.Window(0.9, 1.3))
    (heat,) = [t for t in fig["data"] if t["type"] == "heatmap"]
    x = np.array(heat["x"])
    compute, comm = int(np.argmin(np.abs(x - 1.0))), int(np.argmin(np.abs(x - 1.2)))
    assert fig["layout"]["meta"]["level"] == "spans"
    assert heat["text"][top][compute] == "compute on 7/8" and heat["text"][top][comm] == "comm on 7/8"
    assert heat["text"][bottom][comm] == "slowest: r10 forward"


def test_one_meaning_per_colour_and_the_profiler_export_drawn():
    assert not set(style.KIND_COLORS.values()) & set(style.PHASE_COLORS.values())
    assert style.EXPORT_COLOR not in {*style.KIND_COLORS.values(), *style.PHASE_COLORS.values(), style.STEP_COLOR}
    run = cluster_run(4, straggler=1)
    gaps = distribution.export_gaps(run.steps)
    assert gaps["rank"].tolist() == [0, 1, 2, 3] and gaps["step"].tolist() == [5] * 4
    assert np.allclose(gaps["end"] - gaps["start"], 0.4)
    fig = timeline.figure(run, timeline.full_window(run))
    export = next(t for t in fig["data"] if t["name"] == "profiler export")
    assert len(export["text"]) == 4 * 3 and "after step 5" in export["text"][0]
    assert fig["layout"]["legend"]["title"]["text"].find("phases per step") >= 0


@pytest.mark.jobs
def test_responses_are_compressed(straggler):
    client = app.build([straggler]).server.test_client()
    response = client.get("/_dash-layout", headers={"Accept-Encoding": "gzip"})
    assert response.headers.get("Content-Encoding") == "gzip"
    assert json.loads(gzip.decompress(response.data))["props"]


def test_clicking_a_group_row_opens_it_into_its_ranks():
    run = cluster_run(64, straggler=61)
    board = app.Dashboard([run])
    fig, _ = board.update_timeline(None, None, None, None, 0)
    row = fig["layout"]["meta"]["rows"].index("ranks 8–15 (8 ranks)")
    click = {"points": [{"x": 1.0, "y": row + 0.25, "z": 3}]}  # the group's bottom strip
    expand = board.expand_group(click, None, None, [], 0)
    assert expand == ["block:8"]
    opened, status = board.update_timeline("timeline-expand", None, None, None, 0, expand)
    assert opened["layout"]["meta"]["ranks"] == [61, *range(8, 16)] and "64 ranks" in status
    assert board.expand_group(click, None, None, expand, 0) == []  # clicked again: closed
    with pytest.raises(app.PreventUpdate):
        board.expand_group({"points": [{"x": 1.0, "y": 0}]}, None, None, [], 0)  # the straggler's own lane


@pytest.mark.jobs
def test_the_overview_says_where_the_time_went(straggler):
    head, rows = overview.time_lost(straggler.report)
    [f] = [f for f in straggler.findings if f["kind"] == "straggler"]
    assert head.startswith(f"{straggler.report['ledger']['steady_steps']} steady steps")
    # The costliest cause is the straggler's rank, and what it lost is the finding's price.
    assert rows[0][0].startswith(f"rank {f['ranks'][0]},")
    assert rows[0][2] == f"{straggler.report['ledger']['causes'][0]['lost_s']:.2f} s"
    page = app.Dashboard([straggler]).render_tab("overview", 0)
    assert "time-lost" in str(page)
