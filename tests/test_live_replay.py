"""Live judgement and the final analysis are one judgement (issue 50): real runs' records replayed in pieces.

Each recorded run (tests/fixtures/recorded_runs/) is cut where every rank had finished step N, as a running
job's directory stands then: step records and telemetry up to that step, no traces, dumps or exit records.
Live judgement of that directory (its window holding every step) and the final analysis of it must give the
same verdicts, but for what only a finished run is judged on (a hang, missing evidence, the model's check).
Then the run is fed to live judgement a few steps at a time: a cause present in every step is never
"resolved" while it lasts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from recorded import copy_run
from diagtrain.profiler.util import settings
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.model_check.expected import KINDS as MODEL_KINDS
from diagtrain.profiler.analyzer.judge.live_judge import Live, LiveJudge, Tracked, lasting
from diagtrain.profiler.analyzer.judge.judgement import NOT_LIVE
from diagtrain.profiler.analyzer.run.live_tables import Window
from diagtrain.profiler.analyzer.run.tables import Tables

CUTS = (12, 20, 30)
WHOLE_WINDOW = {"live": {"window_steps": 1000}}  # every step of the cut in live judgement's window
# The final analysis' findings live judgement does not make: what a finished run is judged on.
FINAL_ONLY = (*NOT_LIVE, *MODEL_KINDS)
CAUSES = {"compare-straggler": ("straggler", [1]), "data-stall": ("dataloader_stall", [1]), "leak": ("memory_growth", [1])}


def cut(run: Path, last: int) -> Path:
    """``run`` as it stood when every rank had finished step ``last``: nothing a rank writes later."""
    ends = []
    for path in run.glob("ranks/*/steps.jsonl"):
        kept = [line for line in path.read_text().splitlines()
                if json.loads(line).get("step") is not None and json.loads(line)["step"] <= last]
        path.write_text("".join(line + "\n" for line in kept))
        ends.append(max(json.loads(line)["end"] for line in kept))
    for pattern in ("ranks/*/trace-*", "ranks/*/flight_recorder.json", "ranks/*/exit.json", "ranks/*/stacks*",
                    "telemetry.parquet", "live"):
        for path in run.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in run.glob("hosts/*/telemetry.jsonl"):
        rows = [line for line in path.read_text().splitlines() if json.loads(line).get("time", 0) <= max(ends)]
        path.write_text("".join(line + "\n" for line in rows))
    return run


def verdicts(findings: list[dict]) -> set[tuple]:
    return {(f["kind"], tuple(f["ranks"]), f["severity"]) for f in findings if f["kind"] not in FINAL_ONLY}


def last_end(run: Path) -> float:
    return max(json.loads(line)["end"] for path in run.glob("ranks/*/steps.jsonl") for line in path.read_text().splitlines())


@pytest.mark.parametrize("name", ["compare-clean1", *CAUSES])
@pytest.mark.parametrize("last", CUTS)
def test_live_and_final_judgement_of_the_same_steps_agree(tmp_path, name, last):
    run = cut(copy_run(name, tmp_path / name), last)
    with settings.overriding(WHOLE_WINDOW):
        live = LiveJudge(run).judge(now=last_end(run) + 0.1).active
    final = analyze(run, run, ["json"], workers=1)["findings"]
    assert verdicts(live) == verdicts(final)
    if name in CAUSES and last == CUTS[-1]:  # the injected cause is found, by both
        kind, ranks = CAUSES[name]
        assert any(k == kind and list(r) == ranks and s != "info" for k, r, s in verdicts(final)), verdicts(final)


@pytest.mark.parametrize("name", list(CAUSES))
def test_a_cause_in_every_step_is_never_resolved_while_it_lasts(tmp_path, name):
    run = copy_run(name, tmp_path / name)
    records = {path: path.read_text().splitlines() for path in run.glob("ranks/*/steps.jsonl")}
    for path in [*records, *run.glob("ranks/*/exit.json")]:
        path.write_text("") if path in records else path.unlink()
    judge, events = LiveJudge(run), []
    for last in range(2, 31, 2):
        for path, lines in records.items():
            path.write_text("".join(line + "\n" for line in lines
                                    if json.loads(line).get("step") is not None and json.loads(line)["step"] <= last))
        events += [e.record for e in judge.judge(now=last_end(run) + 0.1).events]
    kind, ranks = CAUSES[name]
    mine = [e for e in events if e["kind"] == kind and e["ranks"] == ranks]
    assert any(e["severity"] != "info" for e in mine), events
    assert not [e for e in mine if e["event"] == "resolved"], mine


def test_a_finding_the_detectors_miss_is_not_resolved_while_the_ledger_still_charges_its_rank():
    # Rank 3 was priced at 40 ms per charged step; in the steps judged since (11-14) it still cost the job
    # 30 ms a step (median): the cause lasts, whatever a detector at the edge of its threshold said. At 5 ms it ended.
    def window(lost: list[float]) -> Window:
        ledger = pd.DataFrame({"rank": [3] * 6 + [0] * 6, "step": list(range(9, 15)) * 2,
                               "lost_ms": [40.0, 40.0, *lost] + [0.0] * 6})
        tables = Tables(steps=pd.DataFrame(), ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[])
        tables.ledger = ledger
        return Window(tables, {}, {}, {})

    tracked = Tracked({"kind": "straggler", "ranks": [3], "metrics": {"charged_ms_per_step": 40.0}}, 9, "warning",
                       last_step=10)
    assert lasting(tracked, window([30.0, 28.0, 35.0, 31.0]), Live.active())
    assert not lasting(tracked, window([5.0, 4.0, 6.0, 30.0]), Live.active())
    unpriced = Tracked({"kind": "low_utilization", "ranks": [3], "metrics": {}}, 9, "warning", last_step=10)
    assert not lasting(unpriced, window([30.0] * 4), Live.active())
