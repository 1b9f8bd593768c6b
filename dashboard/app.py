"""The Dash app: the page, its tabs, and the callbacks that tie them to the views.

Callbacks are methods of :class:`Dashboard` taking plain values (what triggered them included), so
tests call them directly; ``build`` wires them to Dash. Runs are addressed by their index in the
list the command line gave: no request can name a path.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import dash
from dash import ALL, Dash, Input, Output, State, dash_table, dcc, html
from dash.exceptions import PreventUpdate
from flask import Flask, Response, request

from diagtrain.dashboard import (
    communication,
    compare,
    expected,
    figures,
    hang,
    heatmap,
    live,
    memory,
    overview,
    rows,
    telemetry,
    timeline,
)
from diagtrain.dashboard.data import RunData, RunError
from diagtrain.dashboard.style import FINDING_COLORS

ASSETS = Path(__file__).parent / "assets"
TABS = [("overview", "Overview"), ("timeline", "Timeline"), ("steps", "Steps"), ("communication", "Communication"),
        ("memory", "Memory"), ("expected", "Expected"), ("telemetry", "Telemetry"), ("hang", "Hang"),
        ("compare", "Compare")]
# Tabs whose content needs the traces or the final analysis: a running job's shows live.PENDING there.
AFTER_ANALYSIS = ("communication", "expected", "hang", "compare")
# Tabs that follow a running job in place (their figures' own callbacks redraw, the user's choices stay).
IN_PLACE = ("timeline", "steps", "telemetry")
LIVE_VERSION = "live-version"
MAX_LANES_ON_FOCUS = 16  # a finding in a bigger job opens with its ranks and a few peers only
PEER_LANES = 4  # ... that many other ranks, for comparison
DEFAULT_THRESHOLD_PCT = 5.0
MAX_THRESHOLD_PCT = 1000.0  # a regression threshold above 10x means nothing; larger input is a mistake
# Callback requests are a few KiB (ids, a zoom range, lane choices); anything far larger is not
# this page talking, and must not be read into memory.
MAX_REQUEST_BYTES = 1 << 20
# Names a browser on this machine may use for a dashboard bound to a loopback address. Any other
# Host header (a DNS-rebinding page's own name) is refused.
LOCAL_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")  # bound to every address: the names it is reached by are not known
TABLE_STYLE = {"overflowX": "auto"}
CELL_STYLE = {"fontFamily": "monospace", "fontSize": "12px", "padding": "2px 6px", "textAlign": "left"}


class Dashboard:
    """The runs on show and what each callback returns for them."""

    def __init__(self, runs: list[RunData], following: dict[int, live.LiveRun] | None = None) -> None:
        self.runs = runs
        self.following = dict(following or {})  # run index -> the running job it follows
        self.generation = 0  # how many times a followed run changed: what each page last saw is in its live-version
        self._refreshing = threading.Lock()  # every open page's interval asks: one refresh at a time

    def run(self, index: Any) -> RunData:
        """The run at ``index`` (0 or 1); anything else is the first run."""
        return self.runs[index] if isinstance(index, int) and 0 <= index < len(self.runs) else self.runs[0]

    # --- pages -----------------------------------------------------------------------------
    def render_tab(self, tab: str, run_index: int, trigger: str | None = None) -> Any:
        """The content of one tab; on a followed run's change, only where its figures cannot redraw in place."""
        run = self.run(run_index)
        if trigger == LIVE_VERSION and run.live is not None and self._in_place(tab, run):
            raise PreventUpdate
        if run.live is not None or (tab == "compare" and any(r.live is not None for r in self.runs)):
            if tab in AFTER_ANALYSIS:
                return html.P(live.pending("This view"), className="pending")
            if tab != "overview" and run.steps.empty:
                return html.P("No step has finished yet; this page follows the job.", className="pending")
        pages = {"overview": self._overview, "timeline": self._timeline, "steps": self._steps,
                 "communication": self._communication, "memory": self._memory, "expected": self._expected,
                 "telemetry": self._telemetry,
                 "hang": self._hang, "compare": self._compare}
        return pages.get(tab, self._overview)(run)

    @staticmethod
    def _in_place(tab: str, run: RunData) -> bool:
        """Whether the tab's page follows a running job by its own callbacks (an empty page is drawn again)."""
        return tab in IN_PLACE and not run.steps.empty and (tab != "telemetry" or bool(telemetry.metrics(run)))

    def refresh_live(self, seen: dict | None) -> tuple[Any, bool, Any]:
        """Read what the followed jobs appended (a finished one's final analysis replaces it): the live
        badge, whether the refresh stops, and the page's live-version when it has changed since it looked."""
        with self._refreshing:
            for index, follower in list(self.following.items()):
                before = follower.version
                self.runs[index] = follower.refresh()
                try:
                    final = follower.final()
                except RunError:
                    final = None  # the analysis is damaged: the live view stays, and says the job ended
                if final is not None:
                    self.runs[index] = final
                    del self.following[index]
                if final is not None or follower.version != before:
                    self.generation += 1
            changed = (seen or {}).get("generation") != self.generation
            return live_badge(self.runs), not self.following, \
                {"generation": self.generation} if changed else dash.no_update

    def _overview(self, run: RunData) -> Any:
        facts = html.Table([html.Tr([html.Th(k), html.Td(v)]) for k, v in overview.facts(run)], className="facts")
        findings = overview.ordered_findings(run)
        cards = [html.Button([
            html.Span(f["severity"].upper(), className="severity", style={"background": FINDING_COLORS.get(f["severity"])}),
            html.Strong(f" {f['kind']} "), html.Span(overview.where(f), className="where"),
            html.Div(f["explanation"], className="explanation"),
            html.Div(["What to do: ", f["suggestion"]], className="suggestion"),
        ], id={"type": "finding", "index": i}, className="finding", n_clicks=0, title="show on the timeline")
            for i, f in findings]
        goodput_text, goodput_bar = overview.goodput(run.report)
        lost_head, lost_rows = overview.time_lost(run.report)
        lost = html.Table([html.Tr([html.Th(h) for h in ("cause", "when", "lost", "per step", "share of the run")])]
                          + [html.Tr([html.Td(v) for v in row]) for row in lost_rows], className="facts")
        health = [html.Li(f"{h['severity']}: {h['message']}") for h in run.report.get("health") or []]
        skipped = [html.Li(f"{s['path']}: {s['reason']}") for s in run.report.get("skipped") or []]
        following = run.live is not None
        return html.Div([
            html.H3("Run"), facts,
            html.H3(f"{'Live findings' if following else 'Findings'} ({len(findings)})"),
            html.P("What live judgement finds in the recent steps, standing now; the final report replaces it when the "
                   "job ends and is analyzed.", className="hint") if following else None,
            html.Div(cards or [html.P("None standing now." if following else "No problems found.")], id="findings"),
            html.Div([html.H3("Where the job's time went"), html.P(goodput_text.capitalize()),
                      dcc.Graph(figure=goodput_bar, config={"displayModeBar": False})],
                     id="goodput") if goodput_bar is not None else None,
            html.Div([html.H3("Between the ranks"), html.P(lost_head),
                      lost if lost_rows else html.P("No rank made the others wait beyond the noise.")],
                     id="time-lost") if lost_head else None,
            html.Div([html.H3("Trace health"), html.Ul(health)]) if health else None,
            html.Div([html.H3("Skipped inputs"), html.Ul(skipped)]) if skipped else None,
        ])

    def _timeline(self, run: RunData) -> Any:
        options = [{"label": lane.label, "value": lane.rank} for lane in run.lanes]
        groups = [] if len(run.lanes) <= rows.MAX_RANK_LANES else rows.groups(run, run.lanes)
        expand = [{"label": g.label, "value": g.key} for g in groups]
        return html.Div([
            html.Div([
                dcc.Dropdown(id="lanes", options=options, multi=True, placeholder="all ranks", value=[],
                             style={"minWidth": "320px"}),
                dcc.Dropdown(id="timeline-expand", options=expand, multi=True, value=[],
                             placeholder="expand a group into its ranks",
                             style={"minWidth": "320px"} if groups else {"display": "none"}),
                html.Button("Whole run", id="timeline-reset", n_clicks=0),
                html.Span(id="timeline-status", className="status"),
            ], className="controls"),
            dcc.Store(id="timeline-zoom"),
            # Never Plotly's empty default axes while the first figure is on its way.
            dcc.Loading(dcc.Graph(id="timeline", figure=figures.empty("Drawing the timeline…", loading=True),
                                  config={"scrollZoom": True, "displaylogo": False}), delay_show=150,
                        overlay_style={"visibility": "visible", "opacity": 0.6}),  # a zoom keeps the old view
            html.P("Drag to zoom in time, double-click for the whole run. Zoomed out, each step is drawn as its "
                   "phases; zoomed in to a few profiled steps, the operators: compute, communication, memory and idle."
                   + (" Ranks are grouped: each group row shows what most of its ranks do (top strip) and its "
                      "slowest rank (bottom strip); ranks that findings name have lanes of their own. Click a group "
                      "row to open it into its ranks." if groups else "")
                   + (" The job is running: its steps are drawn as they finish. "
                      + live.pending("The operators of profiled steps") if run.live is not None else ""),
                   className="hint"),
        ])

    def _steps(self, run: RunData) -> Any:
        return html.Div([
            html.Div([
                dcc.Dropdown(id="heatmap-metric", options=heatmap.metrics(run), value=heatmap.default_metric(run),
                             clearable=False, style={"minWidth": "320px"}),
                dcc.RadioItems(id="heatmap-mode", value=heatmap.RELATIVE, inline=True, options=[
                    {"label": "difference from the step's median", "value": heatmap.RELATIVE},
                    {"label": "absolute", "value": heatmap.ABSOLUTE}]),
            ], className="controls"),
            dcc.Graph(id="heatmap"),
            dcc.Store(id="heatmap-zoom"),  # the last zoom's relayout (ZOOM_FILTER)
        ])

    def _communication(self, run: RunData) -> Any:
        topo = communication.topology(run)
        return html.Div([
            dcc.RadioItems(id="collectives-mode", value=communication.SUMMARY, inline=True, options=[
                {"label": "by op, group and size", "value": communication.SUMMARY},
                {"label": "every call", "value": communication.PER_COLLECTIVE}]),
            html.P(id="collectives-note", className="hint"),
            dash_table.DataTable(id="collectives", sort_action="native", filter_action="native", page_size=25,
                                 style_table=TABLE_STYLE, style_cell=CELL_STYLE),
            html.H3("NCCL topology and transports"),
            dash_table.DataTable(data=topo, columns=[{"name": k, "id": k} for k in (topo[0] if topo else {})],
                                 style_table=TABLE_STYLE, style_cell=CELL_STYLE) if topo else
            html.P("No NCCL logs in this run (gloo, or NCCL_DEBUG was off)."),
        ])

    def _memory(self, run: RunData) -> Any:
        peaks = html.P(live.pending("Peak memory per rank against its model state"), className="pending") \
            if run.live is not None else dcc.Graph(id="memory-peaks", figure=memory.peaks(run))
        return html.Div([peaks, dcc.Graph(id="memory-time", figure=memory.over_time(run))])

    def _expected(self, run: RunData) -> Any:
        state, state_cols = expected.state_table(run)
        calls, call_cols = expected.collectives_table(run)
        mismatch = [{"if": {"filter_query": "{match} = 'NO'"}, "backgroundColor": "#fde2e2"}]
        return html.Div([
            html.Div([html.P(line) for line in expected.summary(run)], id="expected-summary"),
            dcc.Graph(id="expected-memory", figure=expected.memory_figure(run)),
            html.H3("Model state per rank"),
            dash_table.DataTable(id="expected-state", data=state, columns=state_cols, page_size=32, sort_action="native",
                                 style_table=TABLE_STYLE, style_cell=CELL_STYLE, style_data_conditional=mismatch)
            if state else html.P("No per-rank model state to compare."),
            html.H3("Collectives per step"),
            dash_table.DataTable(id="expected-collectives", data=calls, columns=call_cols, page_size=25,
                                 sort_action="native", filter_action="native", style_table=TABLE_STYLE,
                                 style_cell=CELL_STYLE, style_data_conditional=mismatch)
            if calls else html.P("No profiled collectives to compare (run with --profile-steps)."),
        ])

    def _telemetry(self, run: RunData) -> Any:
        options = telemetry.metrics(run)
        if not options:
            return html.P("No telemetry was recorded for this run.")
        return html.Div([
            dcc.Dropdown(id="telemetry-metric", options=options, value=telemetry.default_metric(run), clearable=False,
                         style={"maxWidth": "320px"}),
            dcc.Graph(id="telemetry"),
        ])

    def _hang(self, run: RunData) -> Any:
        rows, columns = hang.flight_recorder(run)
        stacks = hang.stacks(run)
        status = run.report.get("run", {}).get("status")
        intro = (f"The run ended {status}." if hang.stopped(run) else
                 "Flight-recorder dumps alone: no run record says how the job ended." if status is None else
                 "The run did not hang; the flight recorder below is its last collectives.")
        verdict = [f for f in run.findings if f["kind"] in ("hang", "crash", "collective_mismatch")]
        return html.Div([
            html.P(intro),
            html.Div([html.P(html.Strong(f["explanation"])) for f in verdict[:3]]),
            html.H3("Flight recorder, across ranks (collectives some ranks never entered first)"),
            dash_table.DataTable(id="flight-recorder", data=rows, columns=columns, page_size=25, sort_action="native",
                                 style_table=TABLE_STYLE, style_cell=CELL_STYLE,
                                 style_data_conditional=[{"if": {"filter_query": "{missing} != ''"},
                                                          "backgroundColor": "#fde2e2"}])
            if rows else html.P("No flight-recorder dumps in this run."),
            html.H3("Stacks"),
            html.Div([html.Details([html.Summary(f"rank {s['rank']}: {s['where']}"), html.Pre(s["text"])])
                      for s in stacks] or [html.P("No stacks were dumped (they are taken when a run hangs).")]),
        ])

    def _compare(self, run: RunData) -> Any:
        if len(self.runs) < 2:
            return html.P("Start the dashboard with two runs to compare them: diagtrain dashboard BASE NEW.")
        return html.Div([
            html.Div([html.Label("threshold (%) "),
                      dcc.Input(id="compare-threshold", type="number", value=DEFAULT_THRESHOLD_PCT, min=0, step=1)],
                     className="controls"),
            html.H3(id="compare-verdict"),
            html.Ul(id="compare-findings"),
            dcc.Graph(id="compare-steps"),
            dash_table.DataTable(id="compare-table", columns=compare.COLUMNS, sort_action="native",
                                 filter_action="native", page_size=30, style_table=TABLE_STYLE, style_cell=CELL_STYLE,
                                 style_data_conditional=[{"if": {"filter_query": "{verdict} = 'regression'"},
                                                          "backgroundColor": "#fde2e2"},
                                                         {"if": {"filter_query": "{verdict} = 'inconclusive'"},
                                                          "backgroundColor": "#fdf3d8"},
                                                         {"if": {"filter_query": "{verdict} = 'improvement'"},
                                                          "backgroundColor": "#e2f5e2"}]),
        ])

    # --- interactions ----------------------------------------------------------------------
    def open_finding(self, clicked: Any, clicks: list[int | None], run_index: int) -> tuple[str, dict[str, Any]]:
        """A finding was clicked: the timeline, at its time range and ranks."""
        if not isinstance(clicked, dict) or not any(clicks or []):
            raise PreventUpdate
        run = self.run(run_index)
        index = int(clicked["index"])
        if not 0 <= index < len(run.findings):
            raise PreventUpdate
        window = timeline.finding_window(run, index)
        ranks = run.findings[index].get("ranks") or []
        lanes = [lane.rank for lane in run.lanes]
        if len(lanes) > MAX_LANES_ON_FOCUS and ranks:
            window.ranks = sorted(set(ranks) | set([r for r in lanes if r not in ranks][:PEER_LANES]))
        return "timeline", {"run": run_index, "x0": window.x0, "x1": window.x1, "ranks": window.ranks,
                            "focus": index}

    def update_timeline(self, trigger: str | None, view: dict | None, relayout: dict | None, lanes: list[int] | None,
                        run_index: int, expand: list[str] | None = None) -> tuple[dict[str, Any], str]:
        """The timeline for the stored view, a zoom, a lane choice, an expanded group or a reset."""
        run = self.run(run_index)
        window = timeline.full_window(run)
        if view and view.get("run") == run_index and trigger != "timeline-reset":
            window = timeline.Window(float(view["x0"]), float(view["x1"]), view.get("ranks"), view.get("focus"))
        if trigger in ("timeline", "timeline-zoom", LIVE_VERSION) and relayout:
            zoom = zoomed_range(relayout)
            if zoom == "reset":
                window = replace(timeline.full_window(run), ranks=window.ranks, focus=window.focus)
            elif zoom is not None:
                window = replace(window, x0=zoom[0], x1=zoom[1])  # a running job's new steps keep the zoom
            elif trigger != LIVE_VERSION:
                raise PreventUpdate  # a relayout that is not a zoom (autosize, legend clicks)
        if lanes:
            window.ranks = [int(r) for r in lanes]
        window.expand = [str(key) for key in expand or []]
        figure = timeline.figure(run, window)
        meta = figure["layout"]["meta"]
        groups = len(meta["groups"])
        status = (f"{meta['rank_count']} ranks" + (f" ({len(meta['ranks'])} lanes, {groups} group rows)" if groups else "")
                  + f", {window.x1 - window.x0:.3f} s shown: {meta['level_words']}; {meta['segments']:,} segments"
                  f" from {window.x0:.3f} to {window.x1:.3f} s")
        return figure, status

    def expand_group(self, click: dict | None, view: dict | None, lanes: list[int] | None, expand: list[str] | None,
                     run_index: int) -> list[str]:
        """A click on a group row opens it into its ranks (a click on an opened group's row closes it)."""
        points = (click or {}).get("points") or []
        if not points or "z" not in points[0] or lanes:  # a lane's point, or ranks chosen by hand: no groups
            raise PreventUpdate
        run = self.run(run_index)
        ranks = view.get("ranks") if view and view.get("run") == run_index else None
        table = rows.rows(run, ranks, expand)
        at = round(float(points[0]["y"]))
        if not 0 <= at < len(table) or not table[at].is_group:
            raise PreventUpdate
        key = table[at].key
        opened = list(expand or [])
        return [k for k in opened if k != key] if key in opened else opened + [key]

    def update_heatmap(self, trigger: str | None, metric: str, mode: str, relayout: dict[str, Any] | None,
                       run_index: int) -> dict[str, Any]:
        """The steps heatmap of ``metric``; a zoom (``relayout``, through the zoom filter) on a run of more steps than
        columns redraws its range in finer detail (a shorter run's zoom is the browser's own)."""
        run = self.run(run_index)
        step_range = heatmap.zoomed_range(relayout) if trigger == "heatmap-zoom" else None
        if trigger == "heatmap-zoom" and (step_range is False or run.steps["step"].nunique() <= heatmap.MAX_STEP_COLUMNS):
            raise PreventUpdate
        return heatmap.figure(run, metric, mode, step_range or None)

    def update_telemetry(self, metric: str, run_index: int) -> dict[str, Any]:
        """The telemetry figure of ``metric``."""
        return telemetry.figure(self.run(run_index), metric)

    def update_collectives(self, mode: str, run_index: int) -> tuple[list, list, str]:
        """The collectives table, summarized or per call."""
        return communication.table(self.run(run_index), mode)

    def update_compare(self, threshold: Any) -> tuple[str, list, dict, list]:
        """Verdict, what changed (causes, regressions, undecided metrics), step-time figure and the metric table."""
        base, new = self.runs[0], self.runs[1]
        threshold = DEFAULT_THRESHOLD_PCT if threshold is None else threshold
        if not valid_threshold(threshold):
            return (f"The threshold must be a number from 0 to {MAX_THRESHOLD_PCT:g} (percent); got {str(threshold)[:40]!r}",
                    [], figures.empty("no comparison"), [])
        result = compare.comparison(base, new, float(threshold))
        return f"{compare.verdict(result)} (BASE {base.path.name}, NEW {new.path.name})", \
            [html.Li(line) for line in compare.changes(result)], compare.step_times(base, new), compare.rows(result)


def valid_threshold(value: Any) -> bool:
    """A threshold in percent: a finite number from 0 to MAX_THRESHOLD_PCT (the input box sends any JSON)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= MAX_THRESHOLD_PCT)


def zoomed_range(relayout: dict[str, Any]) -> tuple[float, float] | str | None:
    """The x range a Plotly relayout event zoomed to, ``"reset"`` for a double-click, else None."""
    if relayout.get("xaxis.autorange"):
        return "reset"
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        lo, hi = float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    elif isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        lo, hi = (float(x) for x in relayout["xaxis.range"])
    else:
        return None
    return (lo, hi) if hi > lo else None


ZOOM_FILTER = """function(relayout) {
    var r = relayout || {};
    var zoom = r["xaxis.autorange"] || ("xaxis.range[0]" in r && "xaxis.range[1]" in r) || Array.isArray(r["xaxis.range"]);
    return zoom ? r : window.dash_clientside.no_update;
}"""


def layout(runs: list[RunData]) -> Any:
    """The page: a header (a running job's live badge), the run choice (two runs), the tabs and their content."""
    choices = [{"label": f"{'RUN' if i == 0 else 'RUN2'}: {r.path}", "value": i} for i, r in enumerate(runs)]
    following = any(r.live is not None for r in runs)
    tabs = [dcc.Tab(label=label, value=value) for value, label in TABS if value != "compare" or len(runs) > 1]
    return html.Div([
        html.Div([html.H2("diagtrain"), html.Span(str(runs[0].path), className="run-path"),
                  html.Span(live_badge(runs), id="live-marker")],
                 className="header"),
        # A running job's view asks for what is new every REFRESH_MS, until its final analysis is shown.
        dcc.Interval(id="live-refresh", interval=live.REFRESH_MS, disabled=not following),
        dcc.Store(id=LIVE_VERSION, data={"generation": 0}),
        dcc.RadioItems(id="run", options=choices, value=0, inline=True,
                       style={} if len(runs) > 1 else {"display": "none"}),
        dcc.Tabs(id="tabs", value="overview", children=tabs),
        dcc.Store(id="view"),
        dcc.Loading(html.Div(id="page", className="page"), delay_show=300),
    ], className="app")


def live_badge(runs: list[RunData]) -> Any:
    """The red badge of the runs that are followed live (None when none is)."""
    marks = [live.marker(r) for r in runs if r.live is not None]
    return html.Span(" · ".join(marks), className="live-badge") if marks else None


def build(runs: list[RunData], host: str = "127.0.0.1", following: dict[int, live.LiveRun] | None = None) -> Dash:
    """The Dash app for ``runs`` (one, or BASE and NEW) served on ``host``, callbacks wired; ``following``:
    the running jobs among them (by index), refreshed in place until their final analysis is there."""
    board = Dashboard(runs, following)
    # compress: the timeline's figures are JSON that gzip shrinks ten to twenty times.
    app = Dash(__name__, title="diagtrain", assets_folder=str(ASSETS), suppress_callback_exceptions=True,
               update_title=None, serve_locally=True, compress=True)
    guard(app.server, host)
    app.layout = layout(runs)
    app.callback(Output("page", "children"), Input("tabs", "value"), Input("run", "value"), Input(LIVE_VERSION, "data"))(
        lambda tab, run_index, _seen: board.render_tab(tab, run_index, _trigger()))
    app.callback(Output("live-marker", "children"), Output("live-refresh", "disabled"), Output(LIVE_VERSION, "data"),
                 Input("live-refresh", "n_intervals"), State(LIVE_VERSION, "data"), prevent_initial_call=True)(
        lambda _n, seen: board.refresh_live(seen))
    app.callback(Output("tabs", "value"), Output("view", "data"),
                 Input({"type": "finding", "index": ALL}, "n_clicks"), State("run", "value"),
                 prevent_initial_call=True)(
        lambda clicks, run_index: board.open_finding(dash.ctx.triggered_id, clicks, run_index))
    # Only zooms reach the server: a resize's relayout event, sent while a zoom's figure is on its
    # way, would otherwise supersede that request (Dash applies the latest) and the zoom be lost.
    app.clientside_callback(ZOOM_FILTER, Output("timeline-zoom", "data"), Input("timeline", "relayoutData"),
                            prevent_initial_call=True)
    app.callback(Output("timeline", "figure"), Output("timeline-status", "children"),
                 Input("view", "data"), Input("timeline-zoom", "data"), Input("lanes", "value"),
                 Input("timeline-reset", "n_clicks"), Input("timeline-expand", "value"), Input(LIVE_VERSION, "data"),
                 State("run", "value"))(
        lambda view, relayout, lanes, _reset, expand, _seen, run_index: board.update_timeline(
            _trigger(), view, relayout, lanes, run_index, expand))
    app.callback(Output("timeline-expand", "value"), Input("timeline", "clickData"), State("view", "data"),
                 State("lanes", "value"), State("timeline-expand", "value"), State("run", "value"),
                 prevent_initial_call=True)(board.expand_group)
    # As the timeline's: only zooms reach the server (the graph's autosize as it first draws, or after a zoom, would
    # supersede the request and the figure or the zoom be lost).
    app.clientside_callback(ZOOM_FILTER, Output("heatmap-zoom", "data"), Input("heatmap", "relayoutData"),
                            prevent_initial_call=True)
    app.callback(Output("heatmap", "figure"), Input("heatmap-metric", "value"), Input("heatmap-mode", "value"),
                 Input("heatmap-zoom", "data"), Input(LIVE_VERSION, "data"), State("run", "value"))(
        lambda metric, mode, relayout, _seen, run_index: board.update_heatmap(_trigger(), metric, mode, relayout,
                                                                                run_index))
    app.callback(Output("telemetry", "figure"), Input("telemetry-metric", "value"), Input(LIVE_VERSION, "data"),
                 State("run", "value"))(lambda metric, _seen, run_index: board.update_telemetry(metric, run_index))
    app.callback(Output("collectives", "data"), Output("collectives", "columns"), Output("collectives-note", "children"),
                 Input("collectives-mode", "value"), State("run", "value"))(board.update_collectives)
    if len(runs) > 1:
        app.callback(Output("compare-verdict", "children"), Output("compare-findings", "children"),
                     Output("compare-steps", "figure"), Output("compare-table", "data"),
                     Input("compare-threshold", "value"))(board.update_compare)
    return app


def guard(server: Flask, host: str) -> None:
    """Refuse requests larger than MAX_REQUEST_BYTES, and any Host header but this dashboard's own names."""
    server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES  # 413 before the body is read
    if host in WILDCARDS:
        return
    allowed = {host.strip("[]").lower(), *LOCAL_NAMES}

    @server.before_request
    def check_host() -> Response | None:
        name = request_host_name(request.host)
        if name not in allowed:
            return Response(f"diagtrain dashboard: this server answers to {', '.join(sorted(allowed))}, not to "
                            f"{name[:80]!r}\n", status=403, mimetype="text/plain")
        return None


def request_host_name(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8050`` → ``::1``, ``Example:80`` → ``example``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _trigger() -> str | None:
    triggered = dash.ctx.triggered_id
    return triggered if isinstance(triggered, str) else None
