"""A live window's ledger, built again only for the steps that changed (run/live_ledger.py), is the frame
ledger.build gives for the whole window: as the window moves on, when a step already judged is recorded
again, when a rank's host is crowded (the CPU floor weighs the whole window), when the peer groups or
the columns change, and with counters missing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.run import ledger, live_ledger
from diagtrain.profiler.analyzer.run.live_ledger import LiveLedger
from diagtrain.profiler.analyzer.run.structure import Structure
from diagtrain.profiler.analyzer.run.tables import Tables

RANKS, WINDOW = 6, 8
PHASES = ["forward", "backward"]


def step_rows(step: int, ranks: int = RANKS, slow: int = 1) -> list[dict]:
    """One step of every rank: a little jitter, rank ``slow`` 30 ms slower in its forward, the others waiting."""
    own = {r: {"forward": 20.0 + (r * step) % 3 + (30.0 if r == slow else 0.0), "backward": 40.0 + (r + step) % 2}
           for r in range(ranks)}
    slowest = max(sum(o.values()) for o in own.values())
    rows = []
    for r, o in own.items():
        wait = slowest - sum(o.values()) + 1.0
        rows.append({"rank": r, "step": step, "start": step * 0.1, "end": step * 0.1 + 0.09,
                     "wall_ms": slowest + 3.0, "forward_ms": o["forward"], "backward_ms": o["backward"] + wait,
                     "forward_comm_wait_ms": 0.0, "backward_comm_wait_ms": wait, "comm_wait_ms": wait,
                     "cpu_ms": sum(o.values()), "runq_ms": 0.5 + 0.1 * r, "comm_runq_ms": 0.1})
    return rows


def window(last: int, changed: dict | None = None, structure: Structure | None = None, cpus: int = 2) -> Tables:
    """The tables of the steps up to ``last`` (the last WINDOW), by rank and step as live_tables gives them;
    two hosts of ``cpus`` CPUs, the first busy with other work in its telemetry."""
    rows = [row for step in range(max(1, last - WINDOW + 1), last + 1) for row in step_rows(step)]
    steps = pd.DataFrame(rows).sort_values(["rank", "step"], ignore_index=True)
    for (rank, step), values in (changed or {}).items():
        for column, value in values.items():
            steps.loc[(steps["rank"] == rank) & (steps["step"] == step), column] = value
    hosts = {r: f"node-{r // 3}" for r in range(RANKS)}
    telemetry = pd.DataFrame({"kind": ["host"] * 2, "host": ["node-0", "node-1"], "others_cpu_percent": [50.0, 0.0],
                              "time": [0.0, 0.0]})
    return Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=list(PHASES),
                  rank_hosts=hosts, hosts=[{"name": h, "cpus": cpus} for h in sorted(set(hosts.values()))],
                  telemetry=telemetry, structure=structure or Structure())


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """The number of steps each ledger.build call was given."""
    sizes: list[int] = []
    build = ledger.build

    def counted(t: Tables) -> pd.DataFrame:
        sizes.append(t.steps["step"].nunique())
        return build(t)

    monkeypatch.setattr(live_ledger.ledger, "build", counted)
    return sizes


def test_a_moving_window_builds_only_its_new_step_and_gives_the_whole_ledger(built):
    live = LiveLedger()
    for last in range(WINDOW, WINDOW + 5):
        t = window(last)
        expected = ledger.build(t)
        built.clear()
        pd.testing.assert_frame_equal(live.build(t), expected, check_exact=True)
        assert built == ([WINDOW] if last == WINDOW else [1])  # the first window whole, then its new step
    # The CPU floor is there (two crowded hosts), and weighs the whole window.
    assert expected["cpu_floor_ms"].notna().all()
    assert expected.loc[expected["rank"] == 1, "lost_ms"].gt(0).all()


def test_a_step_recorded_again_is_built_again(built):
    live = LiveLedger()
    live.build(window(WINDOW))
    # Rank 4's step 5 now says it was the slow one, and rank 2's step 6 lost its run-queue counter.
    t = window(WINDOW + 1, changed={(4, 5): {"forward_ms": 90.0, "cpu_ms": 130.0}, (2, 6): {"runq_ms": np.nan}})
    expected = ledger.build(t)
    built.clear()
    found = live.build(t)
    pd.testing.assert_frame_equal(found, expected, check_exact=True)
    assert sorted(built) == [3]  # steps 5, 6 and the new one
    assert found.loc[(found["step"] == 5) & (found["rank"] == 4), "lost_ms"].item() > 0


def test_a_missing_cpu_time_takes_the_floor_of_every_step_as_one_ledger_does(built):
    live = LiveLedger()
    live.build(window(WINDOW))
    t = window(WINDOW + 1, changed={(0, WINDOW + 1): {"cpu_ms": np.nan}})
    found = live.build(t)
    pd.testing.assert_frame_equal(found, ledger.build(t), check_exact=True)
    assert found["cpu_floor_ms"].isna().all()  # a floor from part of the job is none


@pytest.mark.parametrize("change", ["stages", "columns", "rank joins an old step"])
def test_what_every_step_shares_changing_builds_the_whole_window(built, change):
    live = LiveLedger()
    live.build(window(WINDOW))
    t = window(WINDOW + 1)
    if change == "stages":  # a pipeline found: ranks are compared within their stage now
        t = window(WINDOW + 1, structure=Structure(stages={r: r % 2 for r in range(RANKS)}))
    elif change == "columns":
        t.steps["device_idle_ms"] = np.nan
    else:
        t.steps = t.steps[~((t.steps["rank"] == 3) & (t.steps["step"] == 4))].reset_index(drop=True)
        live.build(t)
        t = window(WINDOW + 1)  # ... and comes back
    expected = ledger.build(t)
    built.clear()
    pd.testing.assert_frame_equal(live.build(t), expected, check_exact=True)
    assert built == [WINDOW]


def test_a_window_whose_blocked_time_is_no_longer_recorded_has_no_ledger_as_one_build_gives(built):
    live = LiveLedger()
    live.build(window(WINDOW))
    t = window(WINDOW + 1)
    t.steps["comm_wait_ms"] = np.nan  # every step's counters gone: every step changed
    found = live.build(t)
    pd.testing.assert_frame_equal(found, ledger.build(t), check_exact=True)
    assert found.empty
