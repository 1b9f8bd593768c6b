"""The dashboard's views and callbacks on real analyzed runs, its level of detail, and its safety."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagtrain.dashboard import app, communication, data, heatmap, memory, telemetry, timeline
from diagtrain.dashboard.data import Lane, RunData, Spans

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


def test_timeline_zoomed_out_is_step_blocks_on_every_rank(straggler):
    fig = timeline.figure(straggler, timeline.full_window(straggler))
    meta = fig["layout"]["meta"]
    assert meta["level"] == "steps" and meta["ranks"] == [0, 1, 2, 3]
    assert {t["name"] for t in fig["data"]} >= {"forward", "backward", "optimizer", "step start"}
    assert fig["layout"]["yaxis"]["ticktext"] == [lane.label for lane in straggler.lanes]
    assert meta["segments"] == len(straggler.steps) * len(straggler.phases) - _empty_phases(straggler)


def _empty_phases(run: RunData) -> int:
    return int(sum((run.steps[f"{p}_ms"].fillna(0) <= 0).sum() for p in run.phases))


def test_timeline_zoomed_in_shows_the_spans_of_profiled_steps(straggler):
    s = straggler.steps
    window = timeline.Window(float(s[s["step"] == 4]["start"].min()), float(s[s["step"] == 5]["end"].max()))
    fig = timeline.figure(straggler, window)
    names = {t["name"] for t in fig["data"]}
    assert fig["layout"]["meta"]["level"] == "spans" and {"compute", "comm", "idle"} <= names
    assert fig["layout"]["xaxis"]["range"] == [window.x0, window.x1]
    compute = next(t for t in fig["data"] if t["name"] == "compute")
    assert any(label.startswith("aten::") for label in compute["text"])  # hover names the op


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


def test_memory_against_the_model_state_share(straggler):
    fig = memory.peaks(straggler)
    bars, state = fig["data"][0], fig["data"][1]
    assert bars["x"] == [0, 1, 2, 3] and all(v > 0 for v in bars["y"])
    expected = straggler.ranks.set_index("rank")["parameters"] * 16 / 2**20
    assert state["y"] == pytest.approx(expected.loc[state["x"]].round(1).tolist())
    assert {t["name"] for t in memory.over_time(straggler)["data"]} >= {"rank 0 step peak", "rank 3 RSS"}


def test_telemetry_view(straggler):
    assert telemetry.default_metric(straggler) == "cpu_percent"
    fig = telemetry.figure(straggler, "rss_bytes")
    assert {t["name"] for t in fig["data"]} >= {"rank 0", "rank 3"}
    assert "MiB" in fig["layout"]["title"]["text"]
    assert telemetry.figure(straggler, "no_such_metric")["layout"]["meta"]["empty"]


def test_compare_view_finds_the_regression(clean, straggler):
    board = app.Dashboard([clean, straggler])
    verdict, changes, fig, rows = board.update_compare(10)
    assert verdict.startswith("Regression")
    assert rows[0]["verdict"] == "regression"
    assert any(r["metric"] == "forward" and r["scope"] == "rank 2" and r["verdict"] == "regression" for r in rows)
    assert any("straggler on rank 2" in str(c.children) for c in changes)
    assert [t["name"].split(":")[0] for t in fig["data"]] == ["BASE", "NEW"]


def test_every_tab_renders(straggler, clean):
    board = app.Dashboard([clean, straggler])
    for tab, _ in app.TABS:
        assert board.render_tab(tab, 1) is not None
    assert board.run(7) is clean  # an index nobody gave is the first run, never a path


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
                          {"id": "heatmap-mode", "property": "value", "value": "absolute"}],
               "state": [{"id": "run", "property": "value", "value": "/etc"}], "changedPropIds": ["heatmap-metric.value"]}
    response = client.post("/_dash-update-component", json=payload)
    assert response.status_code == 200
    figure = json.loads(response.data)["response"]["heatmap"]["figure"]
    assert figure["data"][0]["y"] == [0, 1, 2, 3]


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
