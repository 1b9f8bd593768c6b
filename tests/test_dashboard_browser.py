"""The dashboard in headless Chromium, on a real run that `diagtrain dashboard` analyzes first.

Needs Debian's chromium and chromium-driver (.ci/run installs them). Without them the test is
skipped, unless DIAGTRAIN_REQUIRE_BROWSER=1 (CI sets it), where their absence is a failure.
Screenshots go to test-artifacts/ at the repository root (or $DIAGTRAIN_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from diagtrain.dashboard import data, timeline

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("DIAGTRAIN_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))
START_TIMEOUT_S = 240  # the analysis runs first
WAIT_S = 30  # for a callback's result to reach the page

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    if os.environ.get("DIAGTRAIN_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} and {CHROMEDRIVER} are required: apt-get install chromium chromium-driver")
    pytest.skip("no Chromium here (apt-get install chromium chromium-driver)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def server(dashboard_runs, tmp_path_factory):
    """`diagtrain dashboard` on a copy of the straggler run that has not been analyzed."""
    run = tmp_path_factory.mktemp("browser") / "run"
    shutil.copytree(dashboard_runs["straggler"], run, ignore=shutil.ignore_patterns("analysis", "report.*"))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "diagtrain.profiler.cli", "dashboard", str(run), "--port", str(port),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_until_up(url, proc)
        yield url, run, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1500,1100"):
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
    layout = wait.until(lambda d: _layout(d, "timeline"))
    assert layout["meta"]["ranks"] == [0, 1, 2, 3]
    ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#timeline .ytick text")]
    assert [t.split("r")[-1] for t in ticks] == ["0", "1", "2", "3"]
    whole = layout["xaxis"]["range"]

    # Clicking a finding moves the timeline to its range.
    _tab(browser, "Overview")
    index = next(i for i, f in enumerate(run.findings) if f["kind"] == "straggler")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button.finding"))
    browser.find_element(By.XPATH, f"//button[contains(@id, '\"index\":{index},')]").click()
    expected = timeline.finding_window(run, index)
    moved = wait.until(lambda d: (lambda lay: lay if lay and lay["xaxis"]["range"] != whole else None)(
        _layout(d, "timeline")))
    assert moved["xaxis"]["range"] == pytest.approx([expected.x0, expected.x1], abs=1e-6)
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
    legend = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#heatmap .legendtext")]
    assert "straggler (rank 2)" in legend
    browser.save_screenshot(str(ARTIFACTS / "dashboard-steps.png"))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _tab(browser, label: str) -> None:
    browser.find_element(By.XPATH, f"//*[normalize-space(text())='{label}']").click()


def _layout(browser, graph_id: str) -> dict | None:
    """The Plotly layout of a graph once it has been drawn with the server's figure."""
    return browser.execute_script(
        f"var g = document.querySelector('#{graph_id} .js-plotly-plot');"
        "return g && g.layout && g.layout.meta ? {meta: g.layout.meta, xaxis: g.layout.xaxis} : null;")


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
