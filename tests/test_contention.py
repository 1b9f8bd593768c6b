"""A busy host is not a straggler: run-queue delay, CPU time and the host's other processes tell a
rank that did more work from one that was starved of a CPU."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from candidates import straggler_facts
from conftest import diagtrain_run, torchrun
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.assessments.ledger_price import LedgerPrice
from diagtrain.profiler.analyzer.judge.assessments.contention import (NotOwnWork, hidden_work, more_work, own_work_only,
                                                                      starvation)
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.report.wording import explanation
from diagtrain.profiler.analyzer.judge.judgement import run_detectors, judge
from diagtrain.profiler.analyzer.judge.verdict import Results, applied, verdict
from diagtrain.profiler.analyzer.run import ledger
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.collect import telemetry
from diagtrain.profiler.collect.telemetry import OtherProcesses

PHASES = ["forward", "backward", "optimizer"]
STEPS = 10
EXCESS_MS = 40.0  # rank 1's optimizer phase is this much longer in every step
SCALE = 5  # the real job's rank 2 takes this many times its peers' batch


def run_of(extra_cpu: float = 0.0, extra_runq: float = 0.0, counters: bool = True,
           telemetry: pd.DataFrame | None = None, faults: tuple[int, int] | None = None,
           samples: tuple[int, int] | None = None, leak_mib: float | None = None, inside_waits: bool = False) -> Tables:
    """Two ranks on host "h"; rank 1 is EXCESS_MS slower in optimizer, with ``extra_cpu`` ms more
    CPU time and ``extra_runq`` ms more run-queue wait than rank 0 in each step (with ``inside_waits``, all of it
    inside its waits in collectives, which last that much longer), (rank 0's, rank 1's)
    page faults and samples per step where given, and with ``leak_mib`` their resident memory (rank 1's
    growing that much a step)."""
    rows = []
    for step in range(1, STEPS + 1):
        for rank in (0, 1):
            slow = rank == 1
            phases = {"forward": 20.0 + step % 3, "backward": 40.0 + step % 2,
                      "optimizer": 15.0 + (EXCESS_MS if slow else 0.0)}
            wall = sum(phases.values())
            row = {"rank": rank, "step": step, "start": 1000.0 + step, "end": 1000.0 + step + wall / 1e3,
                   "wall_ms": wall, "profiled": False, **{f"{k}_ms": v for k, v in phases.items()}}
            if counters:
                row.update(cpu_ms=60.0 + (extra_cpu if slow else 0.0), runq_ms=1.0 + (extra_runq if slow else 0.0),
                           comm_wait_ms=0.5)
                if inside_waits:
                    inside = extra_runq if slow else 0.0
                    row.update(comm_runq_ms=inside, comm_wait_ms=0.5 + inside)
            if faults:
                row["page_faults"] = faults[rank]
            if samples:
                row["samples"] = samples[rank]
            if leak_mib is not None:
                row["rss_bytes"] = (400 + (leak_mib * step if slow else 0.0)) * 2**20
            rows.append(row)
    return Tables(steps=pd.DataFrame(rows), ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=PHASES,
                  rank_hosts={0: "h", 1: "h"}, telemetry=telemetry)


def busy_host_telemetry() -> pd.DataFrame:
    """A sample a second: the host's CPUs saturated, 0.9 cores of it a process named `hog`."""
    rows = []
    for second in range(STEPS + 2):
        t = 1000.0 + second + 0.5
        rows.append({"time": t, "host": "h", "kind": "host", "cpu_percent": 100.0, "others_cpu_percent": 95.0})
        rows.append({"time": t, "host": "h", "kind": "other", "pid": 4242, "name": "hog", "cpu_percent": 90.0})
    return pd.DataFrame(rows)


def said(f: Finding) -> str:
    """The finding's whole explanation, as the report words it."""
    return explanation(f)


def checked(findings: list[Finding], tables: Tables, prior: list[Results] | None = None) -> list[Finding]:
    """The findings as the host-contention assessment leaves them (``prior``: what earlier steps found of them)."""
    return applied(findings, own_work_only(findings, prior or [Results() for _ in findings], tables))


def by_kind(tables: Tables) -> dict:
    return {f.kind: f for f in judge(tables, lambda _: None, lambda _: None).findings}


def test_a_rank_starved_of_a_cpu_is_not_a_straggler():
    found = by_kind(run_of(extra_runq=EXCESS_MS - 2))
    assert found["straggler"].ranks == [1] and found["straggler"].severity == "info"
    assert "waited 38.0 ms per step longer than its peers for a CPU" in said(found["straggler"])
    assert found["straggler"].metrics["starved"] is True
    # The ranks wait ~20 ms of ~115 ms steps for a CPU: contention, said once, as information.
    contention = found["host_contention"]
    assert contention.severity == "info" and contention.ranks == [0, 1]
    assert contention.metrics["runq_ms_per_step"] == pytest.approx(20.0, abs=0.5)


def test_a_wait_for_a_cpu_inside_a_collective_is_no_starvation_of_the_ranks_own_time():
    """A thread woken from a blocking wait (gloo's) queues for a CPU before the wait returns: that run-queue time
    is part of its wait in the collective, and explains nothing of its own time."""
    steps = list(range(2, STEPS + 1))
    assert starvation(run_of(extra_runq=EXCESS_MS - 2), 1, steps, EXCESS_MS) == \
        NotOwnWork("starved", "cpu_wait", {"extra_ms": pytest.approx(38.0, abs=0.05)})
    assert starvation(run_of(extra_runq=EXCESS_MS - 2, inside_waits=True), 1, steps, EXCESS_MS) is None
    # The ledger splits the step into waits, the run queue outside them and running time, each counted once.
    tables = run_of(extra_runq=30.0, inside_waits=True)
    book = ledger.build(tables).set_index(["rank", "step"])
    assert (book["starved_ms"] == 1.0).all()  # 31 ms in rank 1's run queue, 30 of them inside its waits
    mine = book.xs(1, level="rank")
    assert mine["wait_ms"].to_numpy() == pytest.approx(30.5)
    assert (mine["wait_ms"] + mine["starved_ms"] + mine["running_ms"]).to_numpy() == pytest.approx(mine["wall_ms"].to_numpy())


def test_what_a_starved_rank_still_ran_beyond_its_peers_is_its_own():
    # Rank 1 is 40 ms slower a step, 30 of them waiting for a CPU (more than the share that makes its
    # excess starvation): the ledger, on running time, still prices 10 ms a step of its own work in every
    # step, and that stands on a busy host. Without the ledger the detector's 40 ms is lowered.
    tables = run_of(extra_runq=30.0, telemetry=busy_host_telemetry())
    assert by_kind(tables)["straggler"].severity == "info"
    tables.ledger = ledger.build(tables)
    straggler = by_kind(tables)["straggler"]
    assert straggler.severity == "warning" and "starved" not in straggler.metrics
    assert straggler.metrics["pattern"] == "every step" and straggler.impact_ms == pytest.approx(10.0, abs=1.5)


@pytest.mark.parametrize("extra_cpu,why", [(EXCESS_MS, "it burnt the time itself"), (0.0, "it slept or waited on I/O")])
def test_a_rank_that_did_more_work_or_slept_is_a_straggler_on_a_busy_host_too(extra_cpu, why):
    found = by_kind(run_of(extra_cpu=extra_cpu, telemetry=busy_host_telemetry()))
    assert found["straggler"].ranks == [1] and found["straggler"].severity == "warning", why
    assert "hog (pid 4242) 90%" in said(found["host_contention"])


def test_a_rank_that_churns_memory_for_the_same_samples_is_not_a_straggler():
    # Rank 1 burns its extra 40 ms itself, faulting in 12 MiB more each step than rank 0, for the same 32 samples.
    found = by_kind(run_of(extra_cpu=EXCESS_MS, faults=(20, 3_060), samples=(32, 32)))
    straggler = found["straggler"]
    assert straggler.ranks == [1] and straggler.severity == "info" and straggler.metrics["memory_churn"] is True
    assert "3,040 more page faults per step than they took (3,060 vs 20, 12 MiB)" in said(straggler)
    assert "the same work done more slowly" in said(straggler)


def test_a_leaking_rank_s_page_faults_are_the_leak_s_cost_not_churn():
    # Rank 1 faults in 12 MiB more a step than rank 0 and keeps 8 MiB of it: memory it keeps, not memory its
    # allocator gives back. Its extra 40 ms a step are the leak's cost, said on the straggler, which is
    # information beside the memory_growth finding that names the cause.
    found = by_kind(run_of(extra_cpu=EXCESS_MS, faults=(20, 3_060), samples=(32, 32), leak_mib=8.0))
    assert found["memory_growth"].ranks == [1] and found["memory_growth"].severity != "info"
    straggler = found["straggler"]
    assert straggler.ranks == [1] and straggler.severity == "info" and straggler.metrics["leak_cost"] is True
    assert "memory_churn" not in straggler.metrics
    assert "faulting in 12 MiB a step more than they did while its resident memory grew 8.0 MiB a step" \
        in said(straggler)
    # The leak's finding carries that time: fixing it saves it.
    leak = found["memory_growth"]
    assert straggler.impact_ms > 30 and leak.impact_ms == pytest.approx(straggler.impact_ms)
    assert f"It also costs the job {straggler.impact_ms:.1f} ms a step" in said(leak)
    # Without a memory_growth finding beside it (a run too short to show one), the time stays a straggler's.
    [alone] = checked([verdict(c, []) for c in run_detectors(run_of(extra_cpu=EXCESS_MS, faults=(20, 3_060),
                                                                    samples=(32, 32), leak_mib=8.0), lambda _: None)
                       if c.kind == "straggler"],
                      run_of(extra_cpu=EXCESS_MS, faults=(20, 3_060), samples=(32, 32), leak_mib=8.0))
    assert alone.severity == "warning" and "leak_cost" not in alone.metrics and "memory_churn" not in alone.metrics


@pytest.mark.parametrize("changes,why", [
    ({"samples": (32, 256)}, "eight times the samples: more work, however much it faults"),
    ({"samples": None}, "no samples counted: the work cannot be shown to be the same"),
    ({"extra_cpu": 0.0}, "no extra CPU time: it slept or waited, the faults are beside the point"),
    ({"faults": (2_000, 3_060)}, "its peer faults nearly as much: the job's shape, not one rank's allocator"),
    ({"faults": (20, 200)}, "a few hundred faults cost well under a millisecond"),
])
def test_churn_does_not_excuse_more_work_or_a_rank_that_waits(changes, why):
    given = {"extra_cpu": EXCESS_MS, "faults": (20, 3_060), "samples": (32, 32), **changes}
    straggler = by_kind(run_of(**given))["straggler"]
    assert straggler.severity == "warning" and "memory_churn" not in straggler.metrics, why


def test_churn_is_judged_in_the_steps_the_ledger_charged():
    # Rank 1 churned in steps 2-3 only (glibc's moving threshold at start-up), which the detector saw;
    # the ledger charged it steps 4 and 8 (a checkpoint), where it faulted no more than its peer.
    tables = run_of(extra_cpu=EXCESS_MS, faults=(20, 20), samples=(32, 32))
    tables.steps.loc[(tables.steps["rank"] == 1) & tables.steps["step"].isin([2, 3]), "page_faults"] = 3_060

    def straggler(**metrics) -> Finding:
        return Finding(kind="straggler", severity="warning", explanation="", suggestion="", ranks=[1], steps=[2, 3],
                       metrics={"excess_ms": EXCESS_MS, **metrics})

    [detector_only] = checked([straggler()], tables)
    assert detector_only.severity == "info" and detector_only.metrics["memory_churn"] is True
    price = LedgerPrice(lost_ms=2 * EXCESS_MS, per_step_ms=EXCESS_MS / 4, share=0.25, pattern="every 4 steps", period=4,
                        charged_steps=[4, 8], charged_ms_per_step=EXCESS_MS, noise_ms=1.0, profiled_ms=None)
    [priced] = checked([straggler()], tables, [Results([price])])
    assert priced.severity == "warning" and "memory_churn" not in priced.metrics


def test_a_rank_slow_in_some_steps_only_is_a_straggler_on_a_quiet_host_not_on_a_busy_one():
    def slow_from_step_5(telemetry: pd.DataFrame | None, first: int = 5) -> Tables:
        tables = run_of(extra_cpu=EXCESS_MS, telemetry=telemetry)
        early = (tables.steps["rank"] == 1) & (tables.steps["step"] < first)
        tables.steps.loc[early, ["optimizer_ms", "wall_ms", "cpu_ms"]] -= EXCESS_MS
        return tables

    quiet = by_kind(slow_from_step_5(None))["straggler"]
    assert quiet.severity == "error" and quiet.steps == list(range(5, STEPS + 1))  # 6 of the 9 steps after warm-up
    busy = by_kind(slow_from_step_5(busy_host_telemetry()))["straggler"]
    assert busy.severity == "info" and busy.metrics["busy_host"] is True
    assert "slow in only 6 of the 9 steps it was seen in, on a host whose CPUs other processes kept busy " \
           "(hog (pid 4242) 90%)" in said(busy)
    # Slow in all but one of 9 steps is steady: a pause of the busy host does not make that.
    steady = by_kind(slow_from_step_5(busy_host_telemetry(), first=3))["straggler"]
    assert steady.severity == "error" and steady.steps == list(range(3, STEPS + 1)) and "busy_host" not in steady.metrics
    # Not seen in the steps its only peer stalled on data (no one to compare it with): still every step seen.
    stalled = run_of(extra_cpu=EXCESS_MS, telemetry=busy_host_telemetry())
    stalled.phases = ["data", *PHASES]
    stalled.steps["data_ms"] = 1.0
    stalled.steps.loc[(stalled.steps["rank"] == 0) & stalled.steps["step"].isin([4, 8]), "data_ms"] = 80.0
    straggler = by_kind(stalled)["straggler"]
    assert straggler.severity != "info" and 4 not in straggler.steps and straggler.metrics["steps_seen"] == 7
    # More ranks than cores: every rank waits for a CPU, other processes or not. One slow in some steps
    # is still a straggler there (8 ranks of a 3D job on 2 cores).
    crowded = slow_from_step_5(None)
    crowded.steps["runq_ms"] += 30.0
    assert by_kind(crowded)["straggler"].severity == "error"
    # Slow in every step on the busy host: it did the work itself, a straggler all the same (the test above).


def test_a_rank_that_blocks_itself_in_a_few_steps_is_a_straggler_on_a_busy_host_too():
    """A checkpoint in 2 of 10 steps (torch.save and fsync): off a CPU without waiting for one or for a
    peer. A busy host takes CPU time from a rank; it does not block it. The same excess burnt on a CPU
    in those steps is what a busy host's pauses look like, and stays information."""
    def slow_in_5_and_9(extra_cpu: float) -> Tables:
        tables = run_of(extra_cpu=extra_cpu, telemetry=busy_host_telemetry())
        quiet = (tables.steps["rank"] == 1) & ~tables.steps["step"].isin([5, 9])
        tables.steps.loc[quiet, ["optimizer_ms", "wall_ms"]] -= EXCESS_MS
        tables.steps.loc[quiet, "cpu_ms"] -= extra_cpu
        return tables

    def straggler() -> Finding:  # as the cost pass leaves it: priced, intermittent (too few steps for a period)
        return Finding(kind="straggler", severity="warning", explanation="", suggestion="", ranks=[1], steps=[5, 9],
                       metrics={"excess_ms": EXCESS_MS, "steps_seen": 9})

    [blocked] = checked([straggler()], slow_in_5_and_9(extra_cpu=0.0))
    assert blocked.severity == "warning" and "busy_host" not in blocked.metrics
    [on_cpu] = checked([straggler()], slow_in_5_and_9(extra_cpu=EXCESS_MS))
    assert on_cpu.severity == "info" and on_cpu.metrics["busy_host"] is True


def test_a_data_stall_that_was_a_wait_for_a_cpu_is_information():
    tables = run_of()
    stalled = (tables.steps["rank"] == 1) & tables.steps["step"].isin([4, 8])
    tables.steps["data_ms"] = 1.0
    tables.steps.loc[stalled, "data_ms"] = 30.0
    tables.phases = ["data", *PHASES]
    assert by_kind(tables)["dataloader_stall"].severity == "warning"  # a slow batch: the rank did not wait for a CPU
    tables.steps.loc[stalled, "runq_ms"] += 28.0
    stall = by_kind(tables)["dataloader_stall"]
    assert stall.severity == "info" and "for a CPU" in said(stall)


def test_without_run_queue_counters_a_host_saturated_by_others_lowers_the_straggler():
    found = by_kind(run_of(counters=False, telemetry=busy_host_telemetry()))
    assert found["straggler"].severity == "info"
    assert "saturated by other processes then (hog (pid 4242) 90%)" in said(found["straggler"])
    assert by_kind(run_of(counters=False))["straggler"].severity == "warning"  # a quiet host: no excuse


def test_without_run_queue_counters_a_busy_host_excuses_a_few_times_slower_not_far_slower():
    # The straggler above is 3.7x its peer's optimizer time: lowered. A data wait 200x its peer's
    # (a slow dataset item) is no wait for a CPU, saturated host or not.
    tables = run_of(counters=False, telemetry=busy_host_telemetry())
    tables.phases = ["data", *PHASES]
    tables.steps["data_ms"] = 1.0
    tables.steps.loc[tables.steps["rank"] == 0, "optimizer_ms"] += EXCESS_MS  # no straggler this time
    stalled = (tables.steps["rank"] == 1) & tables.steps["step"].isin([4, 8])
    tables.steps.loc[stalled, "data_ms"] = 200.0
    stall = by_kind(tables)["dataloader_stall"]
    assert stall.ranks == [1] and stall.severity == "warning" and "starved" not in stall.metrics


def test_a_job_shorter_than_the_sampling_interval_is_judged_by_the_sample_after_its_steps():
    tables = run_of(counters=False, telemetry=busy_host_telemetry())
    # All ten steps within 0.45 s, between two 1 Hz samples: the one at 1000.5 s covers them.
    tables.steps["start"] = 1000.0 + tables.steps["step"] * 0.04
    tables.steps["end"] = tables.steps["start"] + 0.04
    contention = by_kind(tables)["host_contention"]
    assert contention.ranks == [0, 1] and "hog (pid 4242) 90%" in said(contention)


@pytest.mark.jobs
def test_other_processes_on_the_host_are_named_with_their_cpu(monkeypatch):
    # On a crowded machine a spinning process may get only a few percent of a core, behind many
    # others: name them all.
    monkeypatch.setattr(telemetry, "OTHERS_NAMED_MIN_PERCENT", 0.5)
    monkeypatch.setattr(telemetry, "OTHERS_NAMED", 10_000)
    spin = [sys.executable, "-c", "while True: pass"]
    # A "job" whose child spins, as a rank would, and a process outside it that spins too.
    job = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run({spin!r})"])
    hog = subprocess.Popen(spin)
    try:
        time.sleep(0.5)  # both spinning
        others = OtherProcesses(job.pid)
        others.sample(100.0, 0.0)  # the first listing is the baseline
        before, started = psutil.Process(hog.pid).cpu_times(), time.monotonic()
        time.sleep(1.0)
        total, named = others.sample(100.0, 0.0)
        after, ended = psutil.Process(hog.pid).cpu_times(), time.monotonic()
        measured = (after.user + after.system - before.user - before.system) / (ended - started) * 100
        [mine] = [row for row in named if row["pid"] == hog.pid]
        assert mine["kind"] == "other" and mine["name"].startswith("python")
        assert mine["cpu_percent"] == pytest.approx(measured, rel=0.5, abs=5) and total >= mine["cpu_percent"]
        job_pids = {job.pid, *(p.pid for p in psutil.Process(job.pid).children(recursive=True))}
        assert len(job_pids) == 2 and not job_pids & {row["pid"] for row in named}
        cores = psutil.cpu_count()
        assert others.sample(0.0, 100.0 * cores) == (0.0, [])  # the ranks explain the load: no listing
    finally:
        for proc in (hog, job):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()


def test_more_work_on_a_crowded_host_is_named_with_its_cost_on_a_cpu_per_rank():
    # Rank 1 burns 90 ms of CPU a step to rank 0's 60 for 3x the samples, on a host of 1 CPU for 2 ranks: its step
    # time hides it (rank 0 waits for the CPU as long). With a CPU per rank it would cost ~30 ms a step (33%).
    tables = run_of(extra_cpu=30.0, samples=(32, 96))
    tables.hosts = [{"name": "h", "cpus": 1}]
    [extra] = more_work(tables)
    assert (extra.rank, extra.estimate_ms, round(extra.share, 2)) == (1, 30.0, 0.33)
    [f] = applied([], hidden_work([], tables))
    assert f.kind == "straggler" and f.ranks == [1] and f.severity == "error"
    assert "1.50x their CPU time per step (90.0 vs 60.0 ms) for 3.0x their samples" in said(f)
    assert f.metrics["estimate_ms_per_step_with_a_cpu_per_rank"] == 30.0
    # The same CPU for the same samples is no more work (an allocator's churn is judged apart); a CPU per rank
    # shows its cost in the step times, where the ledger prices it.
    same_samples = run_of(extra_cpu=30.0, samples=(32, 32))
    same_samples.hosts = [{"name": "h", "cpus": 1}]
    assert more_work(same_samples) == []
    roomy = run_of(extra_cpu=30.0, samples=(32, 96))
    roomy.hosts = [{"name": "h", "cpus": 2}]
    assert more_work(roomy) == []


def test_more_work_is_one_finding_for_its_rank_whatever_parts_of_its_step_were_slow():
    # A detector named rank 1's forward, the ledger its backward too: one cause (it does more work), one finding
    # with both parts' time.
    tables = run_of(extra_cpu=30.0, samples=(32, 96))
    tables.hosts = [{"name": "h", "cpus": 1}]

    def straggler(phase: str, impact_ms: float, severity: str) -> Finding:
        return Finding(kind="straggler", severity=severity, ranks=[1], steps=[3, 4], metrics={"phase": phase},
                       impact_ms=impact_ms, facts=straggler_facts(phase=f"{phase} phase"))

    [f] = applied(found := [straggler("forward", 10.0, "warning"), straggler("backward", 5.0, "error")],
                  hidden_work(found, tables))
    assert f.metrics["phase"] == "forward" and f.impact_ms == 15.0 and f.severity == "error"
    assert "does more work than its peers" in said(f)


@pytest.mark.jobs
def test_four_ranks_on_two_cores_one_with_more_times_the_batch(tmp_path):
    # The case, a real job: the host's contention evens out the step times, the rank is named anyway. The
    # issue's 3x batch was named in 9 of 10 runs beside two CPU hogs (its peers, spinning in gloo's waits, burn
    # CPU too and narrow the difference): 5x keeps the effect far above that noise.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts" / "ddp_loader.py"
    run = tmp_path / "run"
    diagtrain_run(run, "--profile-steps", "none", "--no-analyze", "--", *torchrun(4), str(script), "--steps", "16",
                  "--batch-rank", "2", "--batch-scale", str(SCALE), check=False)  # torch's teardown may crash: the steps stand
    found = [f for f in analyze(run, run, ["json"], workers=1)["findings"]
             if f["kind"] == "straggler" and f["severity"] in ("warning", "error", "critical")]
    assert [f["ranks"] for f in found] == [[2]], found
    assert "with a CPU per rank it would make the others wait" in found[0]["explanation"]
    assert found[0]["metrics"]["samples_per_step"] == SCALE * found[0]["metrics"]["peer_samples_per_step"]
