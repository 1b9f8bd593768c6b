"""The regression gate's judgement on synthetic, deterministic numbers: noise bands, one-run
inconclusiveness, the machine check, root cause first, findings compared by cause."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diagtrain.profiler.cli.compare import EXIT_CODES
from diagtrain.profiler.compare.thresholds import CompareSettings
from diagtrain.profiler.util import settings
from diagtrain.profiler.compare import findings, machine, noise, regression, report

STEPS = 30


def steps(median: float, seed: int, spread: float = 0.01) -> list[float]:
    """STEPS step times around ``median`` (a relative spread of ``spread``), reproducible."""
    return list(median * np.exp(np.random.default_rng(seed).normal(0, spread, STEPS)))


def summary(name: str, step_ms: float, forward_ms: float, seed: int, findings_: list | None = None,
            host: str = "vm", others_cpus: float = 0.1, memory_mib: float = 500.0, forward0_ms: float = 20.0) -> dict:
    """A run summary as summary.summarize writes it, with only what the gate reads."""
    return {"source": name, "strategy": "ddp", "world_size": 2,
            "samples": {"step time": steps(step_ms, seed)},
            "per_rank": {"0": {"forward": steps(forward0_ms, seed + 1), "peak memory": steps(memory_mib, seed + 2, 0.001)},
                         "1": {"forward": steps(forward_ms, seed + 3), "peak memory": steps(memory_mib, seed + 4, 0.001)}},
            "collectives": {}, "findings": findings_ or [],
            "machine": {"hosts": [host], "versions": {"torch": "2.13.0+cpu"}, "telemetry_source": ["psutil"], "gpus": 0,
                        "contention": {"others_cpus": others_cpus, "others": ["python"] if others_cpus > 1 else [],
                                       "runq_share": 0.03, "throttled_share": None}}}


BASE = [summary("b1", 100.0, 20.0, 10), summary("b2", 104.0, 20.5, 20), summary("b3", 98.0, 19.5, 30)]


def by_key(c: regression.Comparison) -> dict[tuple[str, str], regression.MetricResult]:
    return {(r.metric, r.scope): r for r in c.results}


def test_t_quantiles_and_the_band_from_three_runs():
    # The standard tables' one-sided 0.975 quantiles (the default alpha), and 0.99 where the alpha is set to 1%.
    table = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 10: 2.228, 30: 2.042, 120: 1.980}
    assert {df: round(noise.t_quantile(df), 3) for df in table} == table
    with settings.overriding({"compare": {"between_runs_alpha": 0.01}}):
        assert noise.t_quantile(2) == pytest.approx(6.965, abs=1e-3) and noise.t_quantile(9) == pytest.approx(2.821, abs=1e-3)
    band = noise.band([100.0, 104.0, 98.0])
    logs = np.log([100.0, 104.0, 98.0])
    half = noise.t_quantile(2) * logs.std(ddof=1) * math.sqrt(1 + 1 / 3)
    assert band.measured and band.runs == 3
    assert band.center == pytest.approx(math.exp(logs.mean()))
    assert band.high == pytest.approx(math.exp(half)) and band.low == pytest.approx(math.exp(-half))
    assert band.position(band.center * band.high * 1.01) == "above" and band.position(band.center) == "inside"
    # Identical medians do not make the band vanish: it is never narrower than MIN_LOG_SPREAD allows.
    assert noise.band([50.0, 50.0, 50.0]).high == pytest.approx(math.exp(noise.t_quantile(2) * CompareSettings.active().min_log_spread * math.sqrt(4 / 3)))
    one = noise.band([80.0])
    assert not one.measured and one.high == CompareSettings.active().one_run_ceiling


def test_three_runs_call_a_change_beyond_their_spread_and_not_within_it():
    slow = regression.compare(BASE, summary("new", 100.0, 30.0, 40), 5.0)  # rank 1's forward +50%
    forward = by_key(slow)[("forward", "rank 1")]
    assert forward.verdict == "regression" and forward.base_runs == pytest.approx([20.0, 20.5, 19.5], rel=0.01)
    assert slow.verdict == "regression" and EXIT_CODES[slow.verdict] == 1
    same = regression.compare(BASE, summary("new", 103.0, 20.3, 50), 5.0)
    assert same.verdict == "no regression" and EXIT_CODES[same.verdict] == 0
    # The per-step test alone would have called this: 30 steps each side at 1% noise see a 3% change.
    assert by_key(same)[("step time", "run")].p_value < 0.01
    # A threshold above the change keeps it out even when it is beyond the band.
    assert regression.compare(BASE, summary("new", 100.0, 30.0, 40), 60.0).verdict == "no regression"


def test_one_run_is_inconclusive_below_the_ceiling_and_says_how_many_runs_decide():
    c = regression.compare(BASE[:1], summary("new", 160.0, 20.0, 40), 5.0)  # +60% step time
    step = by_key(c)[("step time", "run")]
    assert step.verdict == "inconclusive" and "x2.5" in step.reason
    assert c.verdict == "inconclusive" and EXIT_CODES[c.verdict] == 3
    assert any("keep 3 baseline runs: diagtrain baseline RUN1 RUN2 RUN3 -o base.json" in n for n in c.notes)
    assert report.markdown(c).startswith("## diagtrain compare: inconclusive")
    far = regression.compare(BASE[:1], summary("new", 300.0, 20.0, 40), 5.0)  # x3: beyond what clean runs differ by
    assert by_key(far)[("step time", "run")].verdict == "regression" and far.verdict == "regression"


def test_a_busier_host_or_another_machine_is_inconclusive_never_a_regression():
    busy = regression.compare(BASE, summary("new", 160.0, 20.0, 40, others_cpus=1.6), 5.0)
    step = by_key(busy)[("step time", "run")]
    assert step.verdict == "inconclusive" and "NEW ran with 1.6 other CPUs busy on the host (python)" in step.reason
    assert busy.verdict == "inconclusive"
    # Memory does not follow the host's load: it is still judged.
    heavy = regression.compare(BASE, summary("new", 160.0, 20.0, 40, others_cpus=1.6, memory_mib=700.0), 5.0)
    assert by_key(heavy)[("peak memory", "rank 0")].verdict == "regression"
    other = regression.compare(BASE, summary("new", 160.0, 20.0, 40, host="runner-7"), 5.0)
    assert by_key(other)[("step time", "run")].verdict == "inconclusive"
    assert other.machine.different == ["NEW ran on host runner-7, BASE on vm"]
    vouched = regression.compare(BASE, summary("new", 160.0, 20.0, 40, host="runner-7"), 5.0, same_machine=True)
    assert by_key(vouched)[("step time", "run")].verdict == "regression"


def test_a_baseline_beside_more_load_than_new_cannot_say_no_regression():
    """A clean baseline recorded beside a busy host, NEW with rank 1 30% slower on a quiet one: the base's load hides
    the regression. Every time is inconclusive (exit 3), never unchanged; memory is still judged."""
    loaded = [summary(f"b{i}", ms, fw, seed, others_cpus=1.6)
              for i, (ms, fw, seed) in enumerate(((130.0, 26.0, 10), (134.0, 26.5, 20), (128.0, 25.5, 30)), 1)]
    quiet_slower = summary("new", 130.0, 26.0, 40)
    c = regression.compare(loaded, quiet_slower, 5.0)
    step = by_key(c)[("step time", "run")]
    assert step.verdict == "inconclusive" and "BASE run 1 ran with 1.6 other CPUs busy on the host (python)" in step.reason
    assert c.verdict == "inconclusive" and EXIT_CODES[c.verdict] == 3
    assert any("BASE run 2" in line for line in report.lines(c))
    heavier = regression.compare(loaded, summary("new", 130.0, 26.0, 40, memory_mib=700.0), 5.0)
    assert by_key(heavier)[("peak memory", "rank 0")].verdict == "regression"
    # A NEW slower even than the loaded baseline is still a regression.
    far = regression.compare(loaded, summary("new", 260.0, 60.0, 40), 5.0)
    assert by_key(far)[("step time", "run")].verdict == "regression"


def test_the_rank_and_phase_that_explain_the_run_come_first():
    straggler = {"kind": "straggler", "ranks": [1], "severity": "warning", "explanation": "rank 1 is late", "impact_ms": 40.0}
    c = regression.compare(BASE, summary("new", 150.0, 70.0, 40, findings_=[straggler]), 5.0)
    order = [(r.metric, r.scope) for r in c.regressions]
    assert order[0] == ("forward", "rank 1") and ("step time", "run") in order
    assert order.index(("step time", "run")) == len(order) - 1
    text = report.markdown(c)
    assert text.index("**forward** (rank 1)") < text.index("**step time** (run)")


def finding(kind: str, ranks: list[int], severity: str, impact: float | None = None) -> dict:
    return {"kind": kind, "ranks": ranks, "severity": severity, "explanation": f"{kind} seen", "impact_ms": impact}


def test_findings_compared_by_cause():
    base = [[finding("straggler", [1], "info"), finding("dataloader_stall", [0], "warning"),
             finding("memory_imbalance", [0, 1], "error"), finding("slow_collective", [0], "warning", 10.0)],
            [finding("straggler", [1], "info"), finding("slow_collective", [0], "warning", 11.0),
             finding("exposed_communication", [0, 1], "info")],
            [finding("straggler", [1], "info"), finding("slow_collective", [0], "warning", 10.5)]]
    new = [finding("straggler", [1], "error"), finding("memory_imbalance", [0, 1], "warning"),
           finding("slow_collective", [0], "warning", 40.0), finding("hang", [0, 1], "critical"),
           finding("exposed_communication", [0, 1], "info")]
    changes = {(c.kind, tuple(c.ranks)): c for c in findings.compare_findings(base, new)}
    straggler = changes[("straggler", (1,))]
    assert straggler.change == "worse" and straggler.words == "straggler on rank 1: info in BASE, error in NEW"
    assert changes[("memory_imbalance", (0, 1))].change == "better"
    slow = changes[("slow_collective", (0,))]
    assert slow.change == "worse" and "11.0 → 40.0 ms per step" in slow.words
    assert changes[("hang", (0, 1))].change == "new"
    assert changes[("dataloader_stall", (0,))].change == "resolved"
    assert "in 1 of 3 BASE run(s)" in changes[("dataloader_stall", (0,))].words
    assert changes[("exposed_communication", (0, 1))].change == "unchanged"
    ordered = [c.change for c in findings.compare_findings(base, new)]
    assert ordered == sorted(ordered, key=findings.CHANGES.index)
    # The same impact within the baseline runs' spread is unchanged.
    again = findings.compare_findings(base, [finding("slow_collective", [0], "warning", 10.8)])
    assert [c.change for c in again if c.kind == "slow_collective"] == ["unchanged"]


def test_machine_check_words():
    base = [BASE[0]["machine"], BASE[1]["machine"]]
    new = {**BASE[2]["machine"], "versions": {"torch": "2.14.0"},
           "contention": {"others_cpus": 0.4, "others": [], "runq_share": 0.1, "throttled_share": None}}
    check = machine.check([{"machine": m} for m in base], {"machine": new})
    assert check.same and check.notes == ["NEW ran torch 2.14.0, BASE 2.13.0+cpu"]  # told, not judged
    new["contention"]["others_cpus"] = 0.7  # 0.6 more than the busiest BASE run
    assert not machine.check([{"machine": m} for m in base], {"machine": new}).same


def test_baseline_runs_wider_apart_than_one_run_is_assumed_to_be_decide_nothing():
    wild = [summary("b1", 100.0, 20.0, 10), summary("b2", 210.0, 20.5, 20), summary("b3", 95.0, 19.5, 30)]
    c = regression.compare(wild, summary("new", 180.0, 20.0, 40), 5.0)
    step = by_key(c)[("step time", "run")]
    assert step.verdict == "inconclusive" and "rerun the baseline where the host is quieter" in step.reason
    assert c.verdict == "inconclusive"


def test_one_run_never_calls_a_change_beyond_the_threshold_unchanged_and_says_how_many_runs_would_decide():
    # Rank 1's forward +27%, its steps too noisy for the per-step statistics to vouch for it (60% spread): from one
    # baseline run that is no "unchanged" (the old verdict) but inconclusive, exit 3, with the runs it would take.
    base, new = summary("b1", 100.0, 20.0, 10), summary("new", 100.0, 25.4, 40)
    noisy = steps(20.0, 13, 0.6)
    base["per_rank"]["1"]["forward"], new["per_rank"]["1"]["forward"] = noisy, [1.27 * x for x in reversed(noisy)]
    forward = by_key(c := regression.compare([base], new, 5.0))[("forward", "rank 1")]
    assert forward.change_pct > 5 and forward.p_value > 0.01, forward
    assert forward.verdict == "inconclusive" and "add baseline runs (at least 3 to decide" in forward.reason, forward.reason
    assert EXIT_CODES[c.verdict] == 3
    # Inside --threshold it is unchanged; from three runs the band is measured and decides.
    assert by_key(regression.compare(BASE[:1], summary("new", 100.0, 20.4, 40), 5.0))[("forward", "rank 1")].verdict \
        == "unchanged"
    assert by_key(regression.compare(BASE, new, 5.0))[("forward", "rank 1")].verdict != "inconclusive"
    assert [noise.runs_needed(r) for r in (1.27, 1.05, 1.0)] == [3, 9, None]


def test_from_one_run_a_phase_must_also_grow_by_a_quarter_of_a_step():
    base = [summary("b1", 100.0, 5.0, 10)]
    small = by_key(regression.compare(base, summary("new", 100.0, 16.0, 40), 5.0))[("forward", "rank 1")]
    assert small.verdict == "inconclusive" and "under 25% of a step" in small.reason  # x3.2, but +11 ms
    base = [summary("b1", 100.0, 20.0, 10)]
    large = by_key(regression.compare(base, summary("new", 100.0, 60.0, 40), 5.0))[("forward", "rank 1")]
    assert large.verdict == "regression"  # x3 and +40 ms


def test_three_runs_that_agree_on_one_metric_by_luck_borrow_the_machines_spread():
    # Step time and rank 0's forward spread ~12% between runs; rank 1's forward agreed within 1%.
    base = [summary("b1", 100.0, 20.0, 10, forward0_ms=20.0), summary("b2", 118.0, 20.2, 20, forward0_ms=24.0),
            summary("b3", 90.0, 19.9, 30, forward0_ms=18.0)]
    c = regression.compare(base, summary("new", 100.0, 24.0, 40, forward0_ms=20.0), 5.0)
    forward = by_key(c)[("forward", "rank 1")]
    assert forward.verdict == "unchanged" and forward.noise_high_pct > 20 and c.verdict == "no regression"
    assert noise.log_spread([20.0, 20.2, 19.9]) < 0.01  # alone, its band would have been +10%
    assert by_key(regression.compare(base, summary("new", 100.0, 40.0, 40), 5.0))[("forward", "rank 1")].verdict == \
        "regression"


def test_beyond_the_band_a_phase_must_still_move_the_step():
    # A 2 ms phase at 5 ms (a preemption's time slice): beyond three runs' band, but 3% of a 100 ms step.
    base = [summary(f"b{i}", 100.0, 2.0 + 0.05 * i, 10 * i) for i in (1, 2, 3)]
    tiny = by_key(regression.compare(base, summary("new", 100.0, 5.0, 40), 5.0))[("forward", "rank 1")]
    assert tiny.verdict == "unchanged" and "under 5% of a step" in tiny.reason and tiny.change_pct > 100
    grown = by_key(regression.compare(base, summary("new", 100.0, 9.0, 40), 5.0))[("forward", "rank 1")]
    assert grown.verdict == "regression"  # +7 ms: 7% of the step


def test_among_ranks_the_phase_that_added_most_time_comes_first():
    base = [summary(f"b{i}", 100.0, 20.0, 10 * i, forward0_ms=5.0) for i in (1, 2, 3)]
    c = regression.compare(base, summary("new", 100.0, 60.0, 40, forward0_ms=20.0), 5.0)  # x4 +15 ms; x3 +40 ms
    assert [(r.metric, r.scope) for r in c.regressions][:2] == [("forward", "rank 1"), ("forward", "rank 0")]


def test_the_rank_a_finding_singles_out_comes_before_ranks_a_finding_names_together():
    # Rank 0 waits for rank 1 and adds more time; a new busy-host finding names both ranks, the
    # straggler (lowered to info on that busy host) names rank 1 alone: rank 1 is the cause.
    base = [summary(f"b{i}", 100.0, 20.0, 10 * i) for i in (1, 2, 3)]
    new = summary("new", 180.0, 60.0, 40, forward0_ms=80.0,
                  findings_=[finding("host_contention", [0, 1], "info"), finding("straggler", [1], "info")])
    c = regression.compare(base, new, 5.0)
    assert [(r.metric, r.scope) for r in c.regressions][:2] == [("forward", "rank 1"), ("forward", "rank 0")]


def test_runs_too_short_to_judge_are_inconclusive_never_a_pass():
    short = [{**s, "samples": {"step time": s["samples"]["step time"][:1]},
              "per_rank": {r: {m: v[:1] for m, v in metrics.items()} for r, metrics in s["per_rank"].items()}}
             for s in (BASE[0], summary("new", 100.0, 20.0, 40))]
    c = regression.compare(short[:1], short[1], 5.0)
    assert not c.judged and not c.regressions and c.verdict == "inconclusive"
    assert EXIT_CODES[c.verdict] == 3 and "no metric has enough steps" in report.headline(c)
    assert regression.compare(BASE, summary("new", 100.0, 20.0, 40), 5.0).judged  # full runs are judged


def test_a_busy_stretch_of_a_run_is_noise_and_a_slowdown_of_every_step_is_not():
    # A busy host slows a stretch of a run (here 60% of its steps by a third); a code change slows every step.
    busy = summary("busy", 100.0, 20.0, 40)
    busy["samples"]["step time"] = [t * (4 / 3 if i % 5 < 3 else 1) for i, t in enumerate(busy["samples"]["step time"])]
    step = by_key(regression.compare(BASE, busy, 5.0))[("step time", "run")]
    assert np.median(busy["samples"]["step time"]) > 1.25 * step.base_value  # judged on medians: a regression
    assert step.statistic == "p25" and step.verdict == "unchanged", step
    slower = by_key(regression.compare(BASE, summary("slower", 125.0, 20.0, 40), 5.0))[("step time", "run")]
    assert slower.verdict == "regression" and slower.new_value == pytest.approx(125.0, rel=0.02)
    # Throughput is judged from its quick side too, memory on its median (the host's load does not move it).
    rate = [1000 / t for t in busy["samples"]["step time"]]
    assert noise.pace(rate, higher_is_better=True) == pytest.approx(np.percentile(rate, 75))
    assert by_key(regression.compare(BASE, busy, 5.0))[("peak memory", "rank 0")].statistic == "median"
