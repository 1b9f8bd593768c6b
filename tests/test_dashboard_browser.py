"""The dashboard in headless Chromium, on a real run that `diagtrain dashboard` analyzes first.

Needs Debian's chromium and chromium-driver (.ci/run installs them). Without them the test is
skipped, unless DIAGTRAIN_REQUIRE_BROWSER=1 (CI sets it), where their absence is a failure.
Screenshots go to test-artifacts/ at the repository root (or $DIAGTRAIN_TEST_ARTIFACTS); the
documentation's are this test's (docs/guide/dashboard.md says how to refresh them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_runs import cluster_run
from conftest import JOB_TIMEOUT_S, Run, died_in_teardown, heartbeat_step, torchrun, wait_until
from werkzeug.serving import make_server

from diagtrain.dashboard import app, data, rows, timeline

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("DIAGTRAIN_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))
START_TIMEOUT_S = 240  # the analysis runs first
PLAIN_JOB = Path(__file__).parent / "scripts" / "plain_job.py"
WAIT_S = 30  # for a callback's result to reach the page

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    if os.environ.get("DIAGTRAIN_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} and {CHROMEDRIVER} are required: apt-get install chromium chromium-driver")
    pytest.skip("no Chromium here (apt-get install chromium chromium-driver)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)


@pytest.fixture(scope="module")
def server(dashboard_runs, tmp_path_factory):
    """`diagtrain dashboard` on a copy of the straggler run that has not been analyzed."""
    run = tmp_path_factory.mktemp("browser") / "run"
    shutil.copytree(dashboard_runs["straggler"], run, ignore=shutil.ignore_patterns("analysis", "report.*"))
    with _dashboard(run) as (url, proc):
        yield url, run, proc


@pytest.fixture(scope="module")
def pipeline_server(pipeline_job):
    """`diagtrain dashboard` on the session's analyzed 2-stage pipeline run (gloo send/recv)."""
    with _dashboard(pipeline_job.out) as (url, _):
        yield url


@contextlib.contextmanager
def _dashboard(run: Path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagtrain.profiler.cli", "dashboard", str(run), "--port", str(port),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_until_up(url, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    # The timeline draws with WebGL: SwiftShader gives headless Chromium a software one.
    for arg in ("--headless=new", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1500,1100"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_dashboard_in_a_browser(server, browser):
    url, run_dir, _ = server
    assert (run_dir / "analysis" / "timeline.json").exists()  # the dashboard analyzed the run first
    run = data.load(run_dir)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.get(url)
    wait = WebDriverWait(browser, WAIT_S)
    cards = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
    assert "straggler" in cards[0].text and "rank 2" in cards[0].text  # most severe first
    browser.save_screenshot(str(ARTIFACTS / "dashboard-overview.png"))

    # The timeline shows every rank.
    _tab(browser, "Timeline")
    layout = wait.until(lambda d: _layout(d, "timeline") if _legend(d)["title"] else None)  # drawn
    assert layout["meta"]["ranks"] == [0, 1, 2, 3]
    ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#timeline .ytick text")]
    assert [t.split("r")[-1] for t in ticks] == ["0", "1", "2", "3"]
    # One legend, on screen, naming the level of detail and the phases drawn.
    legend = _legend(browser)
    assert "phases per step" in legend["title"] and {"forward", "backward", "optimizer"} <= set(legend["items"])
    assert legend["top"] >= 0
    whole = layout["xaxis"]["range"]

    # Clicking a finding moves the timeline to its range.
    _tab(browser, "Overview")
    index = next(i for i, f in enumerate(run.findings) if f["kind"] == "straggler")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
    browser.execute_script(SAMPLE_TIMELINE)  # what the timeline shows, every 10 ms, from the click on
    browser.find_element(By.XPATH, f"//button[contains(@id, '\"index\":{index},')]").click()
    expected = timeline.finding_window(run, index)
    moved = wait.until(lambda d: (lambda lay: lay if lay and lay["xaxis"]["range"] != whole else None)(
        _layout(d, "timeline")))
    assert moved["xaxis"]["range"] == pytest.approx([expected.x0, expected.x1], abs=1e-6)
    seen = browser.execute_script("clearInterval(window.__sampler); return window.__samples;")
    assert seen and "blank" not in seen, seen  # a loading message, then the lanes: never Plotly's empty axes
    labels = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#timeline .annotation-text")]
    assert any(t.startswith("straggler (rank 2") for t in labels)  # the band's tag, readable
    browser.save_screenshot(str(ARTIFACTS / "dashboard-finding.png"))

    # Zooming into the profiled steps brings the real spans.
    s = run.steps
    lo, hi = float(s[s["step"] == 4]["start"].min()), float(s[s["step"] == 5]["end"].max())
    browser.execute_script("Plotly.relayout(document.querySelector('#timeline .js-plotly-plot'), "
                           f"{{'xaxis.range': [{lo}, {hi}]}});")
    zoomed = wait.until(lambda d: (lambda lay: lay if lay and lay["meta"]["level"] == "spans" else None)(
        _layout(d, "timeline")))
    assert zoomed["meta"]["segments"] > 0
    browser.save_screenshot(str(ARTIFACTS / "dashboard-timeline-spans.png"))

    # The steps heatmap marks the injected straggler's rank.
    _tab(browser, "Steps")
    heat = wait.until(lambda d: _layout(d, "heatmap"))
    assert heat["meta"]["marked"] == [2]
    # It opens on the quantity the top finding was seen in: in step time everyone waits for the straggler.
    shown = browser.find_element(By.ID, "heatmap-metric").text
    assert shown.startswith("forward phase"), shown
    legend = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#heatmap .legendtext")]
    assert "straggler (rank 2)" in legend
    browser.save_screenshot(str(ARTIFACTS / "dashboard-steps.png"))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_communication_and_memory_in_a_browser(server, pipeline_server, browser):
    """Every collective's group is named (gloo's send/recv too); each rank's peak shows its model state;
    memory over time has one legend entry per kind."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(pipeline_server)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
    _tab(browser, "Communication")
    groups = wait.until(lambda d: _cells(d, "#collectives td[data-dash-column='group']"))
    ops = _cells(browser, "#collectives td[data-dash-column='op']")
    named = dict(zip(ops, groups))
    assert named["send"] == named["recv"] == "default_pg (point-to-point; group inferred from the peers)"
    assert not [g for g in groups if g.strip() in ("", "?", "nan", "None")]
    browser.save_screenshot(str(ARTIFACTS / "dashboard-communication.png"))

    url, _, _ = server
    browser.get(url)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
    _tab(browser, "Memory")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#memory-peaks .legendtext"))
    legend = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#memory-peaks .legendtext")]
    assert any(t.startswith("model state of its shard") for t in legend)
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#memory-peaks .bartext")]
    assert len(labels) == 4 and all(t.startswith("state ") and "MiB" in t for t in labels)  # readable, on every bar
    over_time = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#memory-time .legendtext")]
    assert over_time == ["step peak, all 4 ranks (hover for each)", "process RSS (telemetry), all 4 ranks (hover for each)"]
    browser.save_screenshot(str(ARTIFACTS / "dashboard-memory.png"))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


# A 2-rank job of the plain script whose rank 1 sleeps 300 ms a step against a 50 ms step (test_live.py's
# job): up to 70 s of steps, far more than the live checks need on a busy host; once they pass, the test
# lets the job's remaining steps run without sleeping (HURRY_FILE) and it ends in a second.
LIVE_JOB = {"MODE": "ddp", "STEPS": "200", "STEP_MS": "50", "SLEEP_RANK": "1", "SLEEP_MS": "300", "OMP_NUM_THREADS": "1"}


def test_a_running_job_is_followed_live_then_settles_into_its_report(tmp_path, browser):
    """`diagtrain dashboard` on a job still running under `diagtrain run`: the live badge, the step count
    growing and the live straggler without a reload, then the final report once the run is analyzed."""
    out, hurry = tmp_path / "run", tmp_path / "hurry"
    env = {**{k: v for k, v in os.environ.items() if k != "DIAGTRAIN_RUN_DIR"}, **LIVE_JOB, "HURRY_FILE": str(hurry)}
    console = tmp_path / "console.log"  # a file, not a pipe nobody reads while the job runs
    with open(console, "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out),
                                "--profile-steps", "none", "--", *torchrun(2), str(PLAIN_JOB)], env=env,
                               stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_until(lambda: heartbeat_step(out, 1) >= 1 or job.poll() is not None, "the job's first step")
        assert job.poll() is None, console.read_text()[-3000:]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with _dashboard(out) as (url, _):
            browser.get(url)
            wait = WebDriverWait(browser, JOB_TIMEOUT_S)
            first = wait.until(lambda d: _live_step(d))
            assert (out / "report.json").exists() is False  # opened on the running job, not an analysis
            # New steps and the live straggler arrive without a reload while the job runs.
            seen = wait.until(lambda d: (lambda step: step if step and step > first and _live_card(d) else None)(
                _live_step(d)) or (job.poll() is not None and "ended"))
            assert seen != "ended", "the job ended before the page showed new steps and the live straggler"
            card = _live_card(browser)
            assert "straggler" in card and "rank 1" in card
            assert "Live findings" in browser.find_element(By.ID, "page").text
            browser.save_screenshot(str(ARTIFACTS / "dashboard-live.png"))
            # The steps heatmap takes the new steps in place (its metric stays as chosen).
            _tab(browser, "Steps")
            drawn = wait.until(lambda d: _heatmap_last_step(d))
            wait.until(lambda d: (_heatmap_last_step(d) or 0) > drawn)
            # The timeline draws every rank's steps so far (their operators come with the analysis).
            _tab(browser, "Timeline")
            lanes = wait.until(lambda d: _layout(d, "timeline") if _legend(d)["title"] else None)
            assert lanes["meta"]["ranks"] == [0, 1]
            _tab(browser, "Overview")
            hurry.touch()
            # The job ends, `diagtrain run` analyzes it, and the page becomes its report: no badge.
            report = WebDriverWait(browser, JOB_TIMEOUT_S + START_TIMEOUT_S).until(
                lambda d: not _live_text(d) and "Findings (" in d.find_element(By.ID, "page").text
                and d.find_element(By.ID, "page").text)
            assert (out / "report.json").exists() and "Live findings" not in report
            assert "straggler" in report
            status = browser.find_element(By.XPATH, "//table[@class='facts']//th[text()='status']/following-sibling::td")
            assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            code = job.wait(timeout=JOB_TIMEOUT_S)
            # torch's rare teardown crash after every rank's script ended fails a run that did its work.
            assert (code == 0 and status.text == "ok") or died_in_teardown(Run(out, code, "")), \
                console.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()


def _heatmap_last_step(browser) -> int | None:
    """The last step column the steps heatmap shows (None before it is drawn)."""
    return browser.execute_script("var g = document.querySelector('#heatmap .js-plotly-plot');"
                                  "return g && g.data && g.data[0] && g.data[0].x ? Math.max.apply(null, g.data[0].x) : null;")


def _live_text(browser) -> str:
    return browser.find_element(By.ID, "live-marker").text


def _live_step(browser) -> int | None:
    """N of the badge's ``live: step N, ...`` (None before a step, or once the badge is gone)."""
    match = re.match(r"live: step (\d+),", _live_text(browser))
    return int(match.group(1)) if match else None


def _live_card(browser) -> str:
    """The text of the first live finding card naming a straggler ("" while none stands)."""
    cards = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "button.finding") if "straggler" in c.text]
    return cards[0] if cards else ""


def _cells(browser, selector: str) -> list[str]:
    return [c.text for c in browser.find_elements(By.CSS_SELECTOR, selector)]


@pytest.mark.parametrize("world", [64, 1024])
def test_the_timeline_at_cluster_scale(browser, world):
    """Grouped rows with the straggler on its own lane and a legend; at 64 ranks, a zoom right after the first draw."""
    straggler = world - 3
    server = make_server("127.0.0.1", 0, app.build([cluster_run(world, straggler)]).server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{server.server_port}/")
        wait = WebDriverWait(browser, WAIT_S)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
        _tab(browser, "Timeline")
        first = wait.until(lambda d: _layout(d, "timeline") if _legend(d)["title"] else None)  # drawn
        lo, hi = 2.0, 2.9
        # What the first draw shows, read in the same script that then zooms at once (with a resize too:
        # the resize's relayout must not cost the zoom its figure); at 1,024 ranks, no zoom.
        seen = browser.execute_script(
            "var out = {ticks: Array.from(document.querySelectorAll('#timeline .ytick text'))"
            ".map(function(e) { return e.textContent; }).join(' '), legend: (function() {" + LEGEND_JS + "})()};"
            "if (arguments[0]) { var g = document.querySelector('#timeline .js-plotly-plot');"
            f"Plotly.relayout(g, {{'xaxis.range': [{lo}, {hi}]}}); window.dispatchEvent(new Event('resize')); }}"
            "return out;", world == 64)
        meta = first["meta"]
        assert meta["ranks"] == [straggler] and sum(g["ranks"] for g in meta["groups"]) == world - 1
        assert 1 < len(meta["groups"]) <= rows.MAX_GROUPS
        assert f"r{straggler}" in seen["ticks"] and "ranks 0–" in seen["ticks"]  # lanes labelled
        legend = seen["legend"]
        assert "phases per step" in legend["title"] and "profiler export" in legend["items"]
        if world == 64:
            zoomed = wait.until(lambda d: (lambda lay: lay if lay and lay["xaxis"]["range"] == [lo, hi] and
                                           lay["meta"]["level"] == "spans" else None)(_layout(d, "timeline")))
            time.sleep(1.0)  # anything still in flight lands now
            after = _layout(browser, "timeline")
            assert after["xaxis"]["range"] == [lo, hi] and after["meta"] == zoomed["meta"]
            assert f"from {lo:.3f} to {hi:.3f} s" in browser.find_element(By.ID, "timeline-status").text
            assert "operators of profiled steps" in _legend(browser)["title"]
            browser.save_screenshot(str(ARTIFACTS / f"timeline-{world}-ranks-zoomed.png"))
            browser.find_element(By.ID, "timeline-reset").click()
            wait.until(lambda d: (lambda lay: lay and lay["xaxis"]["range"] == first["xaxis"]["range"])(
                _layout(d, "timeline")))
            # A click on a group row opens it into its ranks, right below it.
            row = first["meta"]["rows"].index("ranks 0–7 (8 ranks)")
            _click_at(browser, "timeline", 1.0, row + 0.25)
            opened = wait.until(lambda d: (lambda lay: lay if lay and len(lay["meta"]["ranks"]) > 1 else None)(
                _layout(d, "timeline")))
            assert opened["meta"]["ranks"] == [straggler, *range(8)]
            browser.save_screenshot(str(ARTIFACTS / f"timeline-{world}-ranks-group-opened.png"))
            _click_at(browser, "timeline", 1.0, row + 0.25)  # clicked again: closed
            wait.until(lambda d: (lambda lay: lay and lay["meta"]["ranks"] == [straggler])(_layout(d, "timeline")))
        time.sleep(0.3)  # the group rows' image is painted just after the layout is set
        browser.save_screenshot(str(ARTIFACTS / f"timeline-{world}-ranks.png"))
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        server.shutdown()


SAMPLE_TIMELINE = """window.__samples = [];
window.__sampler = setInterval(function() {
    var g = document.querySelector('#timeline .js-plotly-plot');
    if (!g || !g.layout) return;
    var m = g.layout.meta;
    window.__samples.push(!m ? 'blank' : m.loading ? 'loading' : m.level ? 'lanes' : 'other');
}, 10);"""


def _click_at(browser, graph_id: str, x: float, y: float) -> None:
    """A real mouse click at data coordinates (x, y) of a graph."""
    offset = browser.execute_script(
        f"var g = document.querySelector('#{graph_id} .js-plotly-plot'), L = g._fullLayout;"
        "var box = g.querySelector('.nsewdrag').getBoundingClientRect();"
        "return [L.xaxis.l2p(arguments[0]) - box.width / 2, L.yaxis.l2p(arguments[1]) - box.height / 2];", x, y)
    drag = browser.find_element(By.CSS_SELECTOR, f"#{graph_id} .nsewdrag")
    ActionChains(browser).move_to_element_with_offset(drag, round(offset[0]), round(offset[1])).click().perform()


LEGEND_JS = """var l = document.querySelector('#timeline .legend');
if (!l) return {title: '', items: [], top: -1};
var t = l.querySelector('.legendtitletext');
return {title: t ? t.textContent : '', top: l.getBoundingClientRect().top + window.scrollY,
        items: Array.from(l.querySelectorAll('.legendtext')).map(function(e) { return e.textContent; })};"""


def _legend(browser) -> dict:
    """The timeline legend's title, entries and position (px from the page top)."""
    return browser.execute_script(LEGEND_JS)


def _tab(browser, label: str) -> None:
    browser.find_element(By.XPATH, f"//*[normalize-space(text())='{label}']").click()


def _layout(browser, graph_id: str) -> dict | None:
    """The Plotly layout of a graph once it has been drawn with the server's figure (not a loading message)."""
    return browser.execute_script(
        f"var g = document.querySelector('#{graph_id} .js-plotly-plot');"
        "return g && g.layout && g.layout.meta && !g.layout.meta.loading ?"
        " {meta: g.layout.meta, xaxis: g.layout.xaxis} : null;")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"diagtrain dashboard exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {START_TIMEOUT_S} s")
