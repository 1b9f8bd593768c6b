"""Device time on CUDA/NCCL runs (issue 49): synthetic run directories with GPU semantics, no GPU needed.

On NCCL every rank's host step lasts the same and its time blocked in collectives is about 0 (``Work.wait()``
returns once the collective is queued). Only the device's timings (CUDA events, NCCL's collective timing) say
who waited for whom: the run directories here hold what the ranks would write (steps.jsonl with
``device_steps`` and ``device_colls``, the end-of-run device line), from a model of 8 GPUs in lockstep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.read.step_cache import read_steps
from diagtrain.profiler.analyzer.run import device_time, ledger as ledger_module
from diagtrain.profiler.analyzer.run.device_time import collective_waits
from diagtrain.profiler.run_dir import write_json_atomic

T0 = 1_790_000_000.0
RANKS, STEPS = 8, 40
SEGMENTS = (60.0, 40.0)  # device work before each of the step's two all-reduces (ms)
TRANSFER_MS = 5.0  # an all-reduce's transfer once every rank arrived
TAIL_MS = 8.0  # the optimizer after the last all-reduce


@dataclass
class Gpus:
    """The job's faults: a rank whose device works ``slow`` times longer, ranks whose host is late."""

    slow: dict[int, float] = field(default_factory=dict)  # rank -> factor on its device work
    late: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> ms its host is late
    for_data: bool = False  # the host is late waiting for its batch: its data phase says so
    subgroups: int = 1  # data-parallel groups of consecutive ranks, as one DeviceMesh dimension's: one name for all
    queued: dict[int, float] = field(default_factory=dict)  # rank -> ms a step its host thread waited for a CPU


def gpu_run(root: Path, gpus: Gpus, device: bool = True) -> Path:
    """A run directory of 8 ranks in lockstep on NCCL: every host step as long as the slowest device's,
    host waits ~0; with ``device``, the device timings each rank's records would carry (a step's in the
    next record, the last step's in the end-of-run device line; rank 0 a step later still)."""
    device_steps, colls, period = _simulate(gpus)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "manifest.json", {"schema_version": 1, "status": "ok", "world_size": RANKS,
                                               "command": ["train.py"], "strategy": "ddp"})
    for r in range(RANKS):
        folder = root / "ranks" / str(r)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": r, "host": "node-a", "hostname": "node-a", "pid": 1,
                                                 "world_size": RANKS})
        if gpus.subgroups > 1:  # what torch says of them: the same name, each rank's own members
            write_json_atomic(folder / "process_groups.json", {"1": {"desc": "dp", "ranks": _members(gpus, r)}})
        lag = 2 if r == 0 else 1
        lines, start = [], T0
        for s in range(1, STEPS + 1):
            wall = period[s] + 0.02 * r  # the hosts meet at the next step's blocking call: equal steps
            record = {"rank": r, "step": s, "start": start, "end": start + wall / 1e3, "duration_ms": wall,
                      "phases_ms": {"data": 1.0 + (gpus.late.get((r, s), 0.0) if gpus.for_data else 0.0),
                                    "forward": wall * 0.3, "backward": wall * 0.6, "optimizer": wall * 0.1},
                      "phase_comm_ms": {"data": 0.0, "forward": 0.0, "backward": 0.04, "optimizer": 0.0},
                      "comm_ms": 0.04, "comm_calls": 2, "cpu_ms": wall * 0.9, "runq_ms": 0.1 + gpus.queued.get(r, 0.0),
                      "comm_runq_ms": 0.01}  # NCCL's waits return once queued: hardly a wake-up to queue after
            if device and s - lag >= 1:
                record.update(_device_fields(r, [s - lag], device_steps, colls))
            lines.append(json.dumps(record))
            start += wall / 1e3
        if device:  # the steps still pending at the end: one line that is not a step
            pending = list(range(STEPS - lag + 1, STEPS + 1))
            lines.append(json.dumps({"schema_version": 1, "rank": r, "kind": "device",
                                     **_device_fields(r, pending, device_steps, colls)}))
        (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _device_fields(rank: int, steps: list[int], device_steps: dict, colls: dict) -> dict:
    return {"device_source": "cuda_events",
            "device_steps": [{"step": s, **device_steps[(rank, s)]} for s in steps],
            "device_colls": [c for s in steps for c in colls[(rank, s)]]}


def _simulate(gpus: Gpus) -> tuple[dict, dict, dict]:
    """Each rank's device step (step_ms, idle_before_ms), its collectives with their durations (transfer plus
    its wait for the last to arrive) and each step's period, from the devices' timeline."""
    end = np.zeros(RANKS)  # when each device finished its previous step
    device_steps, colls, period = {}, {}, {}
    for s in range(1, STEPS + 1):
        idle = np.array([gpus.late.get((r, s), 0.0) for r in range(RANKS)])
        start = end + idle
        clock = start.copy()
        for r in range(RANKS):
            colls[(r, s)] = []
        for k, work in enumerate(SEGMENTS):
            noise = np.array([0.3 * ((r + s + k) % 3) for r in range(RANKS)])
            arrive = clock + np.array([work * gpus.slow.get(r, 1.0) for r in range(RANKS)]) + noise
            done = np.array([arrive[_members(gpus, r)].max() + TRANSFER_MS for r in range(RANKS)])
            for r in range(RANKS):
                colls[(r, s)].append({"step": s, "group": "0" if gpus.subgroups == 1 else "1", "seq": 2 * s + k,
                                      "op": "nccl:all_reduce", "ms": float(done[r] - arrive[r])})
            clock = done
        new_end = clock + TAIL_MS
        for r in range(RANKS):
            device_steps[(r, s)] = {"step_ms": float(new_end[r] - start[r]), "idle_before_ms": float(idle[r])}
        period[s] = float(new_end.max() - end.min())
        end = new_end
    return device_steps, colls, period


def _members(gpus: Gpus, rank: int) -> list[int]:
    size = RANKS // gpus.subgroups
    return list(range(rank // size * size, rank // size * size + size))


def findings(run: Path) -> list[dict]:
    return analyze(run, run, ["json"], workers=1)["findings"]


def named(found: list[dict], rank: int) -> list[dict]:
    """The straggler findings naming ``rank``, each found by the detector on the device's times."""
    mine = [f for f in found if f["kind"] == "straggler" and f["ranks"] == [rank]]
    assert all(f["metrics"]["source"] == "device" for f in mine)
    return mine


def price(f: dict) -> float:
    """The finding's "saves X ms/step": the ledger's, which must have weighed the device's times."""
    assert f["metrics"]["impact_source"] == "ledger"
    return float(f["impact_ms"])


def waited_for(run: Path, rank: int, steps: list[int]) -> None:
    """In the ledger the others waited for ``rank`` in ``steps``, by the device's times."""
    ledger = pd.read_parquet(run / "analysis" / "ledger.parquet")
    rows = ledger[ledger["step"].isin(steps) & (ledger["rank"] != rank)]
    assert set(ledger["time_source"]) == {"device"} and set(rows["waited_for"]) == {rank}


# -- the three faults of issue 49, found on the device's view ---------------------------------------------------


def test_a_gpu_20_percent_slower_is_a_slow_device_and_priced_by_the_others_wait(tmp_path):
    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    [f] = named(findings(run), 3)
    # Its device works 120 ms where the others work 100: each step they wait 20 ms for it in their all-reduces.
    assert f["metrics"]["cause"] == "slow_device" and f["metrics"]["time_source"] == "device"
    assert "on the device" in f["explanation"] and f["severity"] in ("warning", "error")
    assert price(f) == pytest.approx(0.2 * sum(SEGMENTS), rel=0.3)
    waited_for(run, 3, list(range(2, STEPS + 1)))


def test_a_busy_hosts_run_queue_is_no_part_of_a_step_timed_on_the_device(tmp_path):
    """Rank 3's host thread waits 40 ms a step for a CPU, outside its waits (on NCCL they return once queued): its
    device still sets the pace, and a step weighed on the device carries none of the host's run queue."""
    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}, queued={3: 40.0}))
    [f] = named(findings(run), 3)
    assert f["metrics"]["cause"] == "slow_device" and price(f) == pytest.approx(0.2 * sum(SEGMENTS), rel=0.3)
    ledger = pd.read_parquet(run / "analysis" / "ledger.parquet")
    assert set(ledger["time_source"]) == {"device"} and ledger["starved_ms"].isna().all()
    waited_for(run, 3, list(range(2, STEPS + 1)))


def test_a_host_50_ms_late_every_step_is_a_late_host_not_a_slow_gpu(tmp_path):
    run = gpu_run(tmp_path, Gpus(late={(5, s): 50.0 for s in range(1, STEPS + 1)}))
    [f] = named(findings(run), 5)
    assert f["metrics"]["cause"] == "host_late" and f["metrics"]["time_source"] == "device"
    assert "waiting for its host" in f["explanation"] and "not slower" in f["explanation"]
    assert price(f) == pytest.approx(50.0, rel=0.3)
    waited_for(run, 5, list(range(2, STEPS + 1)))


def test_a_host_late_every_5th_step_is_named_with_those_steps(tmp_path):
    late = list(range(5, STEPS + 1, 5))
    run = gpu_run(tmp_path, Gpus(late={(2, s): 50.0 for s in late}))
    [f] = named(findings(run), 2)
    assert f["metrics"]["cause"] == "host_late" and f["steps"] == late
    assert f["metrics"]["pattern"] == "every 5 steps"
    # 50 ms in one step of five: 10 ms per step over the run.
    assert price(f) == pytest.approx(50.0 / 5, rel=0.3)
    waited_for(run, 2, late)


def test_a_host_late_for_its_data_is_a_data_stall_priced_on_the_device(tmp_path):
    """Its host's data phase names the cause (the dataloader_stall detector), the device's idle time prices it."""
    run = gpu_run(tmp_path, Gpus(late={(5, s): 50.0 for s in range(1, STEPS + 1)}, for_data=True))
    found = findings(run)
    assert named(found, 5) == []
    [f] = [f for f in found if f["kind"] == "dataloader_stall"]
    assert f["ranks"] == [5] and price(f) == pytest.approx(50.0, rel=0.3)
    assert f["metrics"]["time_source"] == "host" and f["metrics"]["impact_time_source"] == "device"


@pytest.mark.parametrize("gpus", [Gpus(slow={3: 1.2}), Gpus(late={(5, s): 50.0 for s in range(1, STEPS + 1)})],
                         ids=["slow_gpu", "late_host"])
def test_without_the_device_timings_the_hosts_cannot_tell_who_waited(tmp_path, gpus):
    """The blind spot the device's view removes: the same job's host records alone name nobody."""
    assert [f for f in findings(gpu_run(tmp_path, gpus, device=False)) if f["kind"] == "straggler"] == []


def test_live_judgement_names_the_slow_gpu_from_the_same_columns(tmp_path):
    from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge  # noqa: PLC0415 - live judgement only here

    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    window = LiveJudge(run).steps.window()
    assert set(window.tables.steps["time_source"]) == {"device"}
    assert set(window.tables.ledger.loc[window.tables.ledger["rank"] != 3, "waited_for"]) == {3}
    active = LiveJudge(run).judge(now=T0 + 60).active
    [f] = [f for f in active if f["kind"] == "straggler"]
    assert f["ranks"] == [3] and f["metrics"]["cause"] == "slow_device"


def test_live_judgement_keys_subgroups_that_share_a_name_by_their_members(tmp_path):
    # Two data-parallel groups of 4 (one DeviceMesh dimension: both named "1", each call numbered alike); rank 5
    # is slow. Matched by name alone, 8 ranks would share each call and one of them arrive last.
    from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge  # noqa: PLC0415 - live judgement only here

    run = gpu_run(tmp_path, Gpus(slow={5: 1.2}, subgroups=2))
    steps = LiveJudge(run).steps.window().tables.steps
    last = steps.groupby("step")["last_arrivals"].sum()
    assert set(last) == {2 * len(SEGMENTS)}  # each group's last arrival at each of the step's calls
    assert (steps.loc[steps["rank"] == 5, "last_arrivals"] == len(SEGMENTS)).all()


def test_the_metrics_endpoint_serves_each_ranks_device_wait_beside_the_hosts(tmp_path):
    from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge  # noqa: PLC0415 - live judgement only here
    from diagtrain.profiler.collect.metrics import LiveMetrics  # noqa: PLC0415 - the wrapper's endpoint

    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    metrics = LiveMetrics()
    verdict = LiveJudge(run).judge(now=T0 + 60)
    metrics.update(verdict.latest, verdict.active)
    samples = {(m.name, s.labels.get("rank")): s.value for m in metrics.collect() for s in m.samples}
    waits = {r: samples[("diagtrain_device_collective_wait_seconds", str(r))] for r in range(RANKS)}
    # The slow GPU arrives last at both all-reduces and waits for nobody; the others wait for its 20% more work.
    assert waits[3] == pytest.approx(0.0, abs=1e-3)
    slower_by = 0.2 * sum(SEGMENTS) / 1e3
    assert all(w == pytest.approx(slower_by, abs=2e-3) for r, w in waits.items() if r != 3), waits
    # The host's own view of the same steps: blocked ~0 everywhere (NCCL's waits return once queued).
    assert all(samples[("diagtrain_collective_wait_seconds", str(r))] < 1e-3 for r in range(RANKS))
    assert {samples[("diagtrain_device_last_step", str(r))] for r in range(RANKS)} == {STEPS}


# -- CPU runs read and judged as before ---------------------------------------------------------------------------


def test_a_run_without_device_timings_is_judged_exactly_as_before(tmp_path, monkeypatch):
    from test_ledger import records_run  # noqa: PLC0415 - the ledger tests' CPU job

    run = records_run(tmp_path / "a", {(2, s): {"forward": 100.0} for s in range(1, 13)})
    report = analyze(run, run, ["json"], workers=1)
    steps = pd.read_parquet(run / "analysis" / "ledger.parquet")
    assert "time_source" not in steps
    # The same run with the device's view taken out altogether: the same findings, word for word.
    monkeypatch.setattr(device_time, "add_device_time", lambda steps, *_a, **_k: steps)
    monkeypatch.setattr(ledger_module, "device_view", lambda steps, phases: steps)
    before = analyze(run, tmp_path / "b", ["json"], workers=1)
    assert _judged(report) == _judged(before) and [f["kind"] for f in report["findings"]] == ["straggler"]


def _judged(report: dict) -> list[tuple]:
    return [(f["kind"], f["severity"], f["ranks"], f["steps"], f["explanation"], f["impact_ms"]) for f in report["findings"]]


# -- reading and the device waits ---------------------------------------------------------------------------------


def test_device_waits_are_each_collectives_time_beyond_its_groups_shortest():
    colls = pd.DataFrame({"rank": [0, 1, 2, 0, 1, 2, 0, 1], "step": [1, 1, 1, 1, 1, 1, 2, 2],
                          "group": ["0"] * 6 + ["0", "0"], "seq": [1, 1, 1, 2, 2, 2, 3, 3],
                          "op": ["nccl:all_reduce"] * 8, "ms": [30.0, 5.0, 12.0, 5.0, 9.0, 5.5, 4.0, 7.0]})
    waits = collective_waits(colls).set_index(["rank", "step"])
    # seq 1: rank 1 arrived last (5 ms, the transfer); seq 2: rank 0; seq 3 (step 2, ranks 0 and 1 only): a
    # group seen with three members and timed on two has no known transfer.
    assert waits.loc[(0, 1), "device_comm_wait_ms"] == pytest.approx(25.0 + 0.0)
    assert waits.loc[(1, 1), "device_comm_wait_ms"] == pytest.approx(0.0 + 4.0)
    assert waits.loc[(2, 1), "device_comm_wait_ms"] == pytest.approx(7.0 + 0.5)
    assert [waits.loc[(r, 1), "last_arrivals"] for r in range(3)] == [1, 1, 0]
    assert np.isnan(waits.loc[(0, 2), "device_comm_wait_ms"]) and waits.loc[(0, 2), "last_arrivals"] == 0


def test_steps_timed_on_devices_without_collective_timings_keep_the_hosts_view():
    """A rank whose collectives are not timed (TORCH_NCCL_ENABLE_TIMING=0, or gloo) has unknown device waits."""
    steps = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [1, 1, 2, 2], "wall_ms": 100.0})
    device_steps = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [1, 1, 2, 2], "step_ms": 90.0, "idle_before_ms": 0.0})
    colls = pd.DataFrame({"rank": [0, 1], "step": [1, 1], "group": "0", "seq": 1, "op": "nccl:all_reduce",
                          "ms": [9.0, 5.0]})
    timed = device_time.with_device_time(steps, device_steps, colls)
    # Step 2 had no collective on either rank (both time theirs): it waited for nobody.
    assert list(timed["time_source"]) == ["device"] * 4 and list(timed["device_comm_wait_ms"]) == [4.0, 0.0, 0.0, 0.0]
    untimed = device_time.with_device_time(steps, device_steps, colls.iloc[:0])
    assert set(untimed["time_source"]) == {"host"} and untimed["device_comm_wait_ms"].isna().all()


def test_the_device_line_is_no_step_and_bad_device_values_are_left_out(tmp_path):
    path = tmp_path / "steps.jsonl"
    good = {"step": 1, "group": "0", "seq": 2, "op": "nccl:all_reduce", "ms": 3.5}
    path.write_text("\n".join(json.dumps(r) for r in [
        {"rank": 0, "step": 1, "start": T0, "end": T0 + 0.1, "duration_ms": 100.0, "device_source": "cuda_events"},
        {"rank": 0, "step": 2, "start": T0 + 0.1, "end": T0 + 0.2, "duration_ms": 100.0, "device_source": "cuda_events",
         "device_steps": [{"step": 1, "step_ms": 90.0, "idle_before_ms": 1.0}, {"step": 1, "step_ms": -5.0},
                          "junk", {"step": "1", "step_ms": 1.0, "idle_before_ms": 0.0}],
         "device_colls": [good, {**good, "ms": float("inf")}, {**good, "seq": None}]},
        {"schema_version": 1, "rank": 0, "kind": "device",
         "device_steps": [{"step": 2, "step_ms": 95.0, "idle_before_ms": 0.5}], "device_colls": "junk"},
    ]) + "\n")
    found = read_steps(path, 0)
    rows = found.table.to_dict("records")
    assert [r["step"] for r in rows] == [1, 2] and not found.bad_lines and not found.impossible
    assert rows[1]["device_steps"] == [{"step": 1, "step_ms": 90.0, "idle_before_ms": 1.0}]
    assert rows[1]["device_colls"] == [good]
    assert found.device == {"device_steps": [{"step": 2, "step_ms": 95.0, "idle_before_ms": 0.5}]}


def test_the_step_cache_and_the_tail_read_the_device_timings_as_the_full_read(tmp_path):
    from diagtrain.profiler.analyzer.read.step_cache import read_steps_cached  # noqa: PLC0415
    from diagtrain.profiler.analyzer.read.step_tail import StepTail  # noqa: PLC0415

    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    path = run / "ranks" / "0" / "steps.jsonl"
    full = read_steps(path, 0)
    read_steps_cached(path, 0, tmp_path / "cache")
    cached = read_steps_cached(path, 0, tmp_path / "cache")  # the second read: rows from the cache's Parquet
    tail = StepTail(path, 0, keep=None)
    tail.read()
    pd.testing.assert_frame_equal(cached.table, full.table, check_like=True)
    assert cached.device == full.device
    pd.testing.assert_frame_equal(pd.DataFrame(list(tail.rows.values())), full.table, check_like=True)
    assert tail.found.device == full.device and full.device


def test_flight_recorder_durations_stand_in_for_the_records_device_collectives(tmp_path):
    """A run whose step records carry device steps but whose collectives' times are in the flight recorder
    dumps (NCCL's entries with ``duration_ms``): the same waits."""
    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    with_records = analyze(run, tmp_path / "a", ["json"], workers=1)
    for r in range(RANKS):
        path = run / "ranks" / str(r) / "steps.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        starts = {x["step"]: x["start"] for x in lines if "step" in x}
        entries = []
        for x in lines:
            for c in x.pop("device_colls", []):
                entries.append({"process_group": [c["group"], "default_pg"], "collective_seq_id": c["seq"],
                                "profiling_name": c["op"], "time_created_ns": int((starts[c["step"]] + 0.01) * 1e9),
                                "state": "completed", "duration_ms": c["ms"]})
        path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        write_json_atomic(path.parent / "flight_recorder.json", {"version": "2.4", "rank": r, "entries": entries})
    from_dumps = analyze(run, tmp_path / "b", ["json"], workers=1)
    [a], [b] = named(with_records["findings"], 3), named(from_dumps["findings"], 3)
    assert b["metrics"]["cause"] == "slow_device" and b["impact_ms"] == pytest.approx(a["impact_ms"], rel=1e-6)


def test_compare_weighs_each_ranks_device_busy_time_not_its_waits(tmp_path):
    from diagtrain.profiler.compare.summary import summarize  # noqa: PLC0415

    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    analyze(run, run, ["json"], workers=1)
    per_rank = summarize(run)["per_rank"]
    busy = {r: np.median(per_rank[str(r)]["device_busy"]) for r in (0, 3)}
    assert busy[3] - busy[0] == pytest.approx(0.2 * sum(SEGMENTS), abs=1.0)  # its 20 ms more work, not the others' waits
    assert not {"device_step", "device_comm_wait", "device_idle"} & set(per_rank["0"])


def test_the_dashboards_run_so_far_holds_no_raw_device_lists(tmp_path):
    from diagtrain.profiler.analyzer.run.so_far import RunSoFar  # noqa: PLC0415

    steps = RunSoFar(gpu_run(tmp_path, Gpus(slow={3: 1.2}))).read().steps
    assert len(steps) == RANKS * STEPS and not {"device_steps", "device_colls"} & set(steps.columns)


def test_the_ledger_takes_the_devices_view_where_the_host_recorded_no_blocked_time(tmp_path):
    run = gpu_run(tmp_path, Gpus(slow={3: 1.2}))
    for r in range(RANKS):
        path = run / "ranks" / str(r) / "steps.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        path.write_text("\n".join(json.dumps({k: v for k, v in x.items() if k not in ("comm_ms", "phase_comm_ms")})
                                  for x in lines) + "\n")
    [f] = named(findings(run), 3)
    assert price(f) == pytest.approx(0.2 * sum(SEGMENTS), rel=0.3)


# -- waits the devices could not time: unknown, never zero (issue 61) -----------------------------------------------


def _read_device_run(tmp_path: Path, lines_of: dict[int, list[dict]]) -> pd.DataFrame:
    """Each rank's step records written and read back as the analysis does, with the device's columns."""
    rows, records = [], []
    for rank, lines in lines_of.items():
        path = tmp_path / f"steps-{rank}.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        found = read_steps(path, rank)
        rows.append(found.table)
        records += device_time.records_of(found.table) + device_time.records_of_rows(rank, [], found.device)
    steps = pd.concat(rows, ignore_index=True).drop(columns=list(DEVICE_NAMES), errors="ignore")
    return device_time.add_device_time(steps, records).set_index(["rank", "step"]).sort_index()


DEVICE_NAMES = ("device_steps", "device_colls", "device_colls_lost")


def _device_record(rank: int, step: int, **fields) -> dict:
    return {"rank": rank, "step": step, "start": T0 + step, "end": T0 + step + 0.1, "duration_ms": 100.0,
            "device_source": "cuda_events", "device_steps": [{"step": step, "step_ms": 90.0, "idle_before_ms": 0.0}],
            **fields}


def _call(step: int, ms: float) -> dict:
    return {"step": step, "group": "0", "seq": step, "op": "nccl:all_reduce", "ms": ms}


def test_steps_whose_collectives_the_ring_lost_have_unknown_waits_not_zero(tmp_path):
    """Both ranks read their recorders at the same steps, so a ring that wrapped lost the same steps' collectives on
    both: read as "no collective in the step" they would be waits of 0 and the step weighed on the devices."""
    lost = [{"first_step": 2, "last_step": 3, "entries": 40}]
    timed = _read_device_run(tmp_path, {
        r: [_device_record(r, 1, device_colls=[_call(1, 9.0 if r == 0 else 5.0)]), _device_record(r, 2),
            _device_record(r, 3), _device_record(r, 4, device_colls=[_call(4, 5.0 if r == 0 else 7.0)],
                                                 device_colls_lost=lost)] for r in (0, 1)})
    assert timed.loc[(0, 1), "device_comm_wait_ms"] == pytest.approx(4.0) and timed.loc[(1, 4), "device_comm_wait_ms"] == 2.0
    assert timed.xs(2, level="step")["device_comm_wait_ms"].isna().all()
    assert timed.xs(3, level="step")["device_comm_wait_ms"].isna().all()
    assert timed.groupby("step")["time_source"].first().to_dict() == {1: "device", 2: "host", 3: "host", 4: "device"}


def test_a_rank_whose_collectives_are_untimed_has_unknown_waits_and_its_steps_are_weighed_on_the_hosts(tmp_path):
    """A process group that started with TORCH_NCCL_ENABLE_TIMING off: its rank times its steps, not its collectives."""
    timed = _read_device_run(tmp_path, {
        0: [_device_record(0, s, device_colls=[_call(s, 9.0)]) for s in (1, 2)],
        1: [_device_record(1, s, device_colls=[_call(s, 5.0)]) for s in (1, 2)],
        2: [_device_record(2, s) for s in (1, 2)]})  # untimed
    assert timed.loc[(2, 1), "device_step_ms"] == 90.0 and np.isnan(timed.loc[(2, 1), "device_comm_wait_ms"])
    assert set(timed["time_source"]) == {"host"}
