"""The origin, not the victim: a rank that left its peers waiting in a collective is named (the one that skipped a
batch, left its loop early, or issued a collective of its own), not the rank that died waiting; a fault's first step
is where it began, not an earlier blip of a busy host. Recorded and synthetic runs; one real job."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import diagtrain_run, torchrun
from live_helpers import append_step, two_ranks
from recorded import copy_run
from synthetic_runs import job_run
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge
from diagtrain.profiler.analyzer.report.wording import worded
from diagtrain.profiler.analyzer.run import divergence
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.run_dir import write_json_atomic

DDP_LOADER = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts" / "ddp_loader.py"


def kinds(report: dict) -> list[str]:
    return [f["kind"] for f in report["findings"]]


def test_a_rank_that_skipped_a_batch_is_the_origin_and_its_peer_that_died_waiting_the_consequence(tmp_path):
    """Recorded (tests/recorded.py "early-exit"): rank 1 `continue`s past its 5th batch, ends its script after step 9
    with code 0; rank 0 dies in its next all-reduce with gloo's "Connection closed by peer"."""
    run = copy_run("early-exit", tmp_path / "run")
    report = analyze(run, run, ["json"], workers=1)
    [origin] = [f for f in report["findings"] if f["kind"] == "sequence_divergence"]
    assert "crash" not in kinds(report) and origin == report["findings"][0]
    assert origin["ranks"] == [1] and origin["severity"] == "critical"
    m = origin["metrics"]
    assert (m["parted"], m["parted_step"], m["mine"], m["peers"]) == ("skipped", 5, 64.0, 32.0)
    assert m["waiting"] == [0] and m["last_step"] == 9
    [missed] = m["missed"]  # the all-reduce rank 0 entered after rank 1's last
    assert missed["op"] == "all_reduce" and missed["entered_by"] == [0] and missed["seq"] >= 30
    words = origin["explanation"]
    assert "rank 1 left the job" in words and "in step 5 it took 64 samples" in words
    assert "Then rank 0 failed with a connection error (Connection closed by peer)" in words


def crashed_peer(root: Path, status: str = "failed", leaver_steps: int = 6, peer_steps: int = 6,
                 comm_calls: dict[tuple[int, int], int] | None = None) -> Path:
    """A 2-rank job whose rank 1 ended its script (code 0) after ``leaver_steps`` steps, then rank 0, in its next step,
    lost its connection (``status`` failed) or was stopped by the watchdog (hung)."""
    job_run(root, ranks=2, steps=max(leaver_steps, peer_steps))
    for rank, last in ((0, peer_steps), (1, leaver_steps)):
        path = root / "ranks" / str(rank) / "steps.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()][:last]
        for r in records:
            r["comm_calls"] = (comm_calls or {}).get((rank, r["step"]), 4)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    end = max(json.loads(line)["end"] for line in (root / "ranks" / "1" / "steps.jsonl").read_text().splitlines())
    write_json_atomic(root / "ranks" / "1" / "exit.json", {"code": 0, "reason": "returned", "time": end + 0.01})
    peer = {"code": 1, "reason": "exception", "time": end + 0.5,
            "exception": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:123"} if status == "failed" \
        else {"code": 143, "reason": "terminated", "time": end + 30.0}
    write_json_atomic(root / "ranks" / "0" / "exit.json", peer)
    manifest = json.loads((root / "manifest.json").read_text())
    write_json_atomic(root / "manifest.json", {**manifest, "status": status, "exit_codes": {"0": peer["code"], "1": 0}})
    for rank, last in ((0, peer_steps + 1), (1, leaver_steps)):  # the flight recorder: rank 0 in step 5's all-reduce
        write_json_atomic(root / "ranks" / str(rank) / "process_groups.json", {"0": {"desc": "default_pg", "members": "0,1"}})
        write_json_atomic(root / "ranks" / str(rank) / "flight_recorder.json", {"version": "2.10", "entries": [
            {"collective_seq_id": s, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
             "state": "scheduled", "time_created_ns": int((end - 1 + 0.01 * s) * 1e9), "input_sizes": [[4]]}
            for s in range(1, last + 1)]})
    return root


@pytest.mark.parametrize("status", ["failed", "hung"])
def test_a_rank_that_left_its_loop_early_is_the_origin_on_gloo_and_on_nccl(tmp_path, status):
    """On gloo the peer dies with a lost connection; on NCCL it hangs until the watchdog stops the job: either way the
    rank that ended its script first, with fewer steps, is the origin."""
    run = crashed_peer(tmp_path / status, status, leaver_steps=4, peer_steps=6)
    report = analyze(run, run, ["json"], workers=1)
    [origin] = [f for f in report["findings"] if f["kind"] == "sequence_divergence"]
    assert origin["ranks"] == [1] and origin["metrics"]["parted"] == "fewer steps"
    assert origin["metrics"]["parted_step"] == 5 and "it finished 4 steps" in origin["explanation"]
    assert origin["metrics"]["missed"] == [{"group": "default_pg", "seq": 5, "op": "all_reduce", "entered_by": [0]}]
    assert not {"crash", "hang"} & set(kinds(report))


def test_a_rank_that_ended_while_its_peer_was_in_a_final_collective_is_the_origin(tmp_path):
    """The same steps on both ranks, no flight recorder to say more: rank 1 ended its script, rank 0 then lost its
    connection in a collective after them (a barrier or all-reduce only it made at the end)."""
    run = crashed_peer(tmp_path / "run", "failed", leaver_steps=6, peer_steps=6)
    for rank in (0, 1):
        (run / "ranks" / str(rank) / "flight_recorder.json").unlink()
    report = analyze(run, run, ["json"], workers=1)
    [origin] = [f for f in report["findings"] if f["kind"] == "sequence_divergence"]
    assert origin["ranks"] == [1] and origin["metrics"]["parted"] == "at the end" and origin["steps"] == []
    assert "it finished the same steps as its peers (6)" in origin["explanation"]


def test_a_hung_rank_stuck_outside_any_collective_is_not_left_waiting_by_one_that_ended(tmp_path):
    """A hung run whose rank 0 is stuck in its own code (its flight recorder no further than rank 1's), while rank 1
    ended well: nobody waited for rank 1 in a collective, so it is no origin."""
    run = crashed_peer(tmp_path / "run", "hung", leaver_steps=6, peer_steps=6)
    write_json_atomic(run / "ranks" / "0" / "flight_recorder.json",
                      json.loads((run / "ranks" / "1" / "flight_recorder.json").read_text()))
    assert "sequence_divergence" not in kinds(analyze(run, run, ["json"], workers=1))


def test_a_rank_that_ended_well_after_its_peer_crashed_is_no_origin(tmp_path):
    """A real crash stays a crash: rank 0 raised an error of its own (not a lost connection); rank 1 ending well
    meanwhile left nobody waiting."""
    run = crashed_peer(tmp_path / "run")
    record = json.loads((run / "ranks" / "0" / "exit.json").read_text())
    write_json_atomic(run / "ranks" / "0" / "exit.json", {**record, "exception": "ValueError: bad sample"})
    report = analyze(run, run, ["json"], workers=1)
    assert "sequence_divergence" not in kinds(report) and "crash" in kinds(report)


def test_a_collective_of_one_ranks_own_is_where_the_sequences_part():
    steps = pd.DataFrame([{"rank": r, "step": s, "comm_calls": 4 + (r == 0 and s == 3), "samples": 32}
                          for r in (0, 1) for s in range(1, 7)])
    t = Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[])
    parted = divergence.parting(t, 0, [1])
    assert (parted.how, parted.step, parted.mine, parted.peers) == ("collectives", 3, 5.0, 4.0)
    same = divergence.parting(t, 1, [0])  # its peer's extra collective shows on the peer, not on it
    assert (same.how, same.step) == ("collectives", 3)


def test_a_fault_begins_where_it_began_not_at_an_earlier_blip(tmp_path):
    """Rank 1 is 60 ms slower from step 80 of 120; before it, a busy host made it 25 ms late in six steps."""
    blips = {7, 10, 19, 21, 31, 32}
    run = job_run(tmp_path / "run", lambda r, s: {"forward": 60.0 if s >= 80 else 25.0 if s in blips else 0.0}
                  if r == 1 else {}, steps=120)
    report = analyze(run, run, ["json"], workers=1)
    [slow] = [f for f in report["findings"] if f["kind"] == "straggler"]
    assert slow["ranks"] == [1] and min(slow["steps"]) == 80 and slow["severity"] in ("warning", "error")
    assert "since step 80" in slow["explanation"]
    assert "steps 7" not in slow["explanation"] and "7, 10" not in slow["explanation"]
    [cause] = [c for c in report["ledger"]["causes"] if c["rank"] == 1]
    assert cause["onset"] == 80 and cause["pattern"] == "every step"
    # Priced from its onset: 60 ms in 41 of 119 steady steps.
    assert slow["impact_ms"] == pytest.approx(60.0 * 41 / 119, rel=0.1)


def test_live_says_since_the_step_a_fault_began_not_its_first_blip(tmp_path):
    """Rank 1 late now and then early on (20 ms in steps 4 and 9: an informational straggler live judgement follows),
    then 150 ms late from step 25: the live line that first says it says since step 25, not since step 4."""
    start = two_ranks(tmp_path)
    judge = LiveJudge(tmp_path)
    events = []
    for step in range(1, 36):
        late = 150.0 if step >= 25 else 20.0 if step in (4, 9) else 0.0
        for rank in (0, 1):
            append_step(tmp_path, rank, step, start, late if rank == 1 else 0.0, late)
        events += [e for e in worded(judge.judge(now=start + 0.4 * step + 0.3)).events if e.record["kind"] == "straggler"]
    assert (events[0].record["event"], events[0].record["severity"], events[0].record["since_step"]) == ("new", "info", 4)
    said = [e.line for e in events if e.line]
    assert said and "started straggler on rank 1 since step 25" in said[0], said


@pytest.mark.jobs
def test_a_real_rank_that_breaks_out_of_its_loop_early_is_the_origin(tmp_path):
    out = tmp_path / "run"
    diagtrain_run(out, "--profile-steps", "none", "--", *torchrun(2), str(DDP_LOADER), "--steps", "10",
                  "--break-rank", "1", "--break-step", "6", check=False)
    report = json.loads((out / "report.json").read_text())
    [origin] = [f for f in report["findings"] if f["kind"] == "sequence_divergence"]
    assert origin["ranks"] == [1] and origin["metrics"]["parted"] == "fewer steps"
    assert origin["metrics"]["last_step"] == 6 and origin["metrics"]["waiting"] == [0]
    assert "crash" not in kinds(report)
