"""Several hosts, one run: two `diagtrain run` wrappers share one --out, each starting torchrun
--nnodes 2 with a c10d rendezvous, one of them with its wall clock moved ahead (see multihost.py:
their own network namespaces and hostnames where this machine allows it, else the loopback).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from conftest import JOB_TIMEOUT_S, heartbeat_step, processes_with, wait_until
from multihost import build_shim, free_port, host_names, shifted, start, two_hosts, wrapper, wrapper_host
from diagtrain.profiler.analyzer.run import clocks
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.collect import manifest
from diagtrain.profiler.run_dir import read_hosts

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

SHIFT_S = 3.5  # host B's clock ahead: far beyond the alignment error, within c10d's keep-alive tolerance


@pytest.fixture(scope="module")
def clock_shim(tmp_path_factory) -> Path:
    """The preload library, built with this machine's C compiler (a test dependency like Chromium)."""
    shim = build_shim(tmp_path_factory.mktemp("shim"))
    moved = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], capture_output=True, text=True,
                           env={**os.environ, **shifted(shim, SHIFT_S)})
    assert abs(float(moved.stdout) - time.time() - SHIFT_S) < 1.0, "the shim does not move the wall clock"
    return shim


@pytest.fixture(scope="module")
def aligned_run(tmp_path_factory, clock_shim) -> dict:
    """A clean 2-host run, 2 ranks per host, steps 2-4 profiled; host B's clock SHIFT_S ahead and its
    command a second longer than A's, so that A ends first."""
    out = tmp_path_factory.mktemp("hosts") / "run"
    marker = uuid.uuid4().hex
    with two_hosts() as (a, b, isolated):
        endpoint = f"{a.addr}:{29500 if isolated else free_port()}"
        common = {"STEPS": "6", "STEP_SLEEP": "0.02", "TEST_MARKER": marker}
        options = ["--profile-steps", "2-4", "--telemetry-interval", "0.2"]
        procs = {"a": start(wrapper(a, out, endpoint, 2, *options), {**common, **a.env})}
        wait_until(lambda: list(out.glob("hosts/*/host.json")), "host A to claim its folder")  # then B joins
        procs["b"] = start(wrapper(b, out, endpoint, 2, *options, after=1.0),
                           {**common, **b.env, **shifted(clock_shim, SHIFT_S)})
        errs = {k: p.communicate(timeout=JOB_TIMEOUT_S)[1] for k, p in procs.items()}
    for key, proc in procs.items():
        assert proc.returncode == 0, f"host {key}:\n{errs[key][-3000:]}"
    names = {key: wrapper_host(out, proc.pid) for key, proc in procs.items()}
    return {"out": out, "stderr": errs, "isolated": isolated, "marker": marker, "names": names}


def test_two_wrappers_are_two_hosts_of_one_run(aligned_run):
    out = aligned_run["out"]
    hosts = host_names(out)
    expected = {"node-a", "node-b"} if aligned_run["isolated"] else {socket.gethostname(), f"{socket.gethostname()}-2"}
    assert set(hosts) == expected
    assert sorted(r for ranks in hosts.values() for r in ranks) == [0, 1, 2, 3]
    assert all(len(ranks) == 2 for ranks in hosts.values())  # from what each rank reported, not --node-rank
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["world_size"] == 4
    for record in manifest["hosts"]:  # every host record ended
        assert record["status"] == "ok" and record["exit_code"] == 0 and record["ended_at"] >= record["started_at"]
        assert (out / "hosts" / record["name"] / "console.log").exists()
    if aligned_run["isolated"]:  # each rank ran under its host's own hostname
        for rank in range(4):
            info = json.loads((out / f"ranks/{rank}/rank.json").read_text())
            assert info["hostname"] == info["host"]
    assert set(pd.read_parquet(out / "telemetry.parquet")["host"]) == set(hosts)
    assert processes_with(aligned_run["marker"]) == []


def test_exactly_one_analysis_by_the_last_host(aligned_run):
    out, errs = aligned_run["out"], aligned_run["stderr"]
    a_name, b_name = aligned_run["names"]["a"], aligned_run["names"]["b"]
    assert f"joining the run of {a_name} as host {b_name}" in errs["b"] and "joining" not in errs["a"]
    # A ended first: it says so and leaves the analysis to B, which ends last.
    assert f"this host ({a_name}) is done: ok (exit code 0); waiting for {b_name}" in errs["a"]
    assert "diagtrain: report" not in errs["a"] and errs["b"].count("diagtrain: report") == 1
    assert (out / "analysis" / "claimed-by").read_text().strip() == b_name
    assert f"ok ({', '.join(f'{n}: ok' for n in sorted([a_name, b_name]))})" in errs["b"]


def test_clock_handshake_measures_the_shift(aligned_run):
    out, names = aligned_run["out"], aligned_run["names"]
    measured = []
    for name, peer, sign in ((names["a"], names["b"], -1), (names["b"], names["a"], 1)):
        path = out / "hosts" / name / "clock.json"
        for m in json.loads(path.read_text())["measurements"] if path.exists() else []:
            assert m["peer"] == peer
            measured.append(m)
            # B - A is SHIFT_S; the error is bounded by half the best round trip.
            assert abs(sign * m["offset_s"] - SHIFT_S) <= m["uncertainty_s"] + 1e-6
            assert m["uncertainty_s"] < 0.05
    assert measured


def test_steps_telemetry_and_traces_line_up_on_one_clock(aligned_run):
    out, names = aligned_run["out"], aligned_run["names"]
    hosts = host_names(out)
    of_host = {r: h for h, ranks in hosts.items() for r in ranks}
    # The reference clock is rank 0's host: the other host's times move by the shift, one way or the other.
    moved = next(h for h in hosts if h != of_host[0])
    expected_s = -SHIFT_S if moved == names["b"] else SHIFT_S
    steps = pd.read_parquet(out / "analysis" / "steps.parquet").set_index(["rank", "step"])
    rank = hosts[moved][0]
    recorded = pd.Series({r["step"]: r["end"] for r in map(json.loads, (out / f"ranks/{rank}/steps.jsonl").open())})
    applied = float((steps.loc[rank, "end"] - recorded).median())
    # The offset applied is the known shift, within what the wrappers' handshake proved: the handshake
    # says the truth lies in offset ± u, and the traces' estimate is clamped into that same interval,
    # so the two can sit at its opposite ends, 2u apart.
    bound = min(m["uncertainty_s"] for name in hosts if (out / "hosts" / name / "clock.json").exists()
                for m in json.loads((out / "hosts" / name / "clock.json").read_text())["measurements"])
    assert abs(applied - expected_s) <= 2 * bound + 1e-4, (applied, expected_s, bound)
    # ... and it moved everything that host recorded: steps, traces, telemetry, the timeline's spans.
    for r in range(4):
        shift = applied if of_host[r] == moved else 0.0
        own = pd.Series({x["step"]: x["end"] for x in map(json.loads, (out / f"ranks/{r}/steps.jsonl").open())})
        assert (steps.loc[r, "end"] - own).abs().sub(abs(shift)).abs().max() < 1e-5
        traced = pd.read_feather(out / f"analysis/cache/rank-{r}/steps.arrow").set_index("step")["end_us"] / 1e6
        assert (steps.loc[r, "trace_end"].dropna() - traced).sub(shift).abs().max() < 1e-5
    raw = pd.read_parquet(out / "telemetry.parquet")
    aligned = pd.read_parquet(out / "analysis" / "telemetry.parquet")
    for host in hosts:
        moved_by = (aligned.loc[aligned["host"] == host, "time"].sort_values().reset_index(drop=True)
                    - raw.loc[raw["host"] == host, "time"].sort_values().reset_index(drop=True)).dt.total_seconds()
        assert (moved_by - (applied if host == moved else 0.0)).abs().max() < 1e-5
    # The dashboard's spans are published on the run's clock: the cached ones (each rank's own clock) moved.
    timeline = json.loads((out / "analysis" / "timeline.json").read_text())["ranks"]
    for r in range(4):
        published = pd.read_parquet(out / "analysis" / timeline[str(r)]["spans"])["start_us"]
        cached = pd.read_parquet(out / f"analysis/cache/rank-{r}/spans.parquet")["start_us"]
        assert ((published - cached) / 1e6 - (applied if of_host[r] == moved else 0.0)).abs().max() < 1e-6
    # What a person sees: the hosts' steps end together, as closely as one host's ranks do (busy
    # cores add a few ms between hosts; unaligned they would be SHIFT_S apart).
    for column in ("end", "trace_end"):
        table = steps[column].dropna().unstack(level=0)
        by_host = [table[sorted(ranks)] for ranks in hosts.values()]
        intra = max((t.max(axis=1) - t.min(axis=1)).max() for t in by_host)
        across = (by_host[0].mean(axis=1) - by_host[1].mean(axis=1)).abs().median()
        assert across <= intra + 0.01, f"{column}: hosts {across * 1e3:.1f} ms apart, one host's ranks {intra * 1e3:.1f} ms"
    report = json.loads((out / "report.json").read_text())
    [note] = [h["message"] for h in report["health"] if h["check"] == "clocks"]
    assert note.startswith(f"host {moved}: every time it recorded was moved by {applied * 1e3:+.1f} ms"), note
    assert not [f for f in report["findings"] if f["kind"] in ("hang", "crash", "interrupted", "host_lost")]


def test_a_host_killed_mid_run_is_named_as_the_cause(tmp_path, clock_shim):
    out, marker = tmp_path / "run", uuid.uuid4().hex
    with two_hosts() as (a, b, isolated):
        endpoint = f"{a.addr}:{29500 if isolated else free_port()}"
        common = {"STEPS": "100000", "STEP_SLEEP": "0.05", "TEST_MARKER": marker}
        host_a = start(wrapper(a, out, endpoint, 1), {**common, **a.env})
        # B's clock runs ahead: unaligned, its last heartbeat would look later than A's connection errors.
        host_b = start(wrapper(b, out, endpoint, 1),
                       {**common, **b.env, **shifted(clock_shim, SHIFT_S)})
        try:
            wait_until(lambda: all(heartbeat_step(out, r) >= 3 for r in (0, 1)), "both ranks at step 3")
            b_name = wrapper_host(out, host_b.pid)
            host_b.send_signal(signal.SIGKILL)
            _, err_a = host_a.communicate(timeout=JOB_TIMEOUT_S)
        finally:
            host_a.kill()
            host_b.kill()
    assert host_a.returncode != 0
    wait_until(lambda: processes_with(marker) == [], "every process of the job to end")
    manifest = json.loads((out / "manifest.json").read_text())
    statuses = {h["name"]: h["status"] for h in manifest["hosts"]}
    a_name = next(n for n in statuses if n != b_name)
    assert statuses == {b_name: "abandoned", a_name: "failed"} and manifest["status"] == "abandoned"
    assert all(h["ended_at"] or h["last_seen"] for h in manifest["hosts"])
    report = json.loads((out / "report.json").read_text())
    first = report["findings"][0]
    assert first["kind"] == "host_lost" and first["severity"] == "critical" and first["metrics"]["host"] == b_name
    assert f"host {b_name} was lost" in first["explanation"]
    assert "failed with a connection error" in first["explanation"] and "a consequence" in first["explanation"]
    assert not [f for f in report["findings"] if f["kind"] in ("crash", "hang")]
    assert "diagtrain: report" in err_a and (out / "analysis/claimed-by").read_text().strip() == a_name
    # No profiled step here: the handshake alone put the hosts on one clock, steps included.
    [note] = [h["message"] for h in report["health"] if h["check"] == "clocks"]
    assert "from the wrappers' clock handshake" in note
    ends = pd.read_parquet(out / "analysis/steps.parquet").pivot_table(index="step", columns="rank", values="end")
    assert (ends[0] - ends[1]).abs().median() < 0.05  # SHIFT_S apart without it
    # The lost host's own record still says running; what every reader sees (the analyzer's too) is abandoned.
    assert json.loads((out / "hosts" / b_name / "host.json").read_text())["status"] == "running"
    assert {h["name"]: h["status"] for h in read_hosts(out)}[b_name] == "abandoned"


# -- on small run directories written here: the verdict's logic, without running a job --

T0 = 1_790_000_000.0  # the reference clock's time of the fake runs' first step
STEP_S = 0.5


def fake_host_run(root: Path, hosts: dict[str, float], ranks: dict[int, str], status: dict[str, str],
                  exits: dict[int, dict], steps: int = 6) -> Path:
    """A run directory as the wrappers and ranks write it; ``hosts`` maps each host to how far its
    clock runs ahead (seconds): every time it records carries that."""
    for rank, host in ranks.items():
        ahead = hosts[host]
        folder = root / "ranks" / str(rank)
        folder.mkdir(parents=True)
        (folder / "rank.json").write_text(json.dumps({"rank": rank, "host": host, "hostname": host, "pid": 1,
                                                      "world_size": len(ranks), "started_at": T0 - 5 + ahead}))
        (folder / "steps.jsonl").write_text("".join(
            json.dumps({"rank": rank, "step": s, "start": T0 + (s - 1) * STEP_S + ahead, "end": T0 + s * STEP_S + ahead,
                        "duration_ms": STEP_S * 1e3, "phases_ms": {}}) + "\n" for s in range(1, steps + 1)))
        if rank in exits:
            (folder / "exit.json").write_text(json.dumps({**exits[rank], "time": exits[rank]["time"] + ahead}))
    for host, ahead in hosts.items():
        folder = root / "hosts" / host
        folder.mkdir(parents=True)
        record = {"name": host, "hostname": host, "status": status[host], "exit_code": 1, "started_at": T0 - 6 + ahead,
                  "ended_at": T0 + 60 + ahead, "process": {"pid": 1, "start_ticks": 1, "boot_id": "elsewhere",
                                                           "pid_ns": "pid:[1]"}}
        if status[host] == "interrupted":
            record["interrupted"] = {"signal": "SIGTERM", "time": T0 + steps * STEP_S + 0.2 + ahead}
        (folder / "host.json").write_text(json.dumps(record))
        (folder / "heartbeat").write_text(json.dumps({"seq": 9, "time": T0 + steps * STEP_S + ahead}))
    (root / "manifest.json").write_text(json.dumps({"status": "interrupted", "world_size": len(ranks)}))
    return root


def two_host_stop(root: Path, ahead: float) -> Path:
    """vm-2 (ranks 2, 3) stopped by SIGTERM just after step 6; its ranks end 50 ms later; ranks 0, 1
    on vm lose their connections 300 ms after the stop."""
    end = T0 + 6 * STEP_S
    return fake_host_run(
        root, {"vm": 0.0, "vm-2": ahead}, {0: "vm", 1: "vm", 2: "vm-2", 3: "vm-2"},
        {"vm": "failed", "vm-2": "interrupted"},
        {0: {"code": 1, "reason": "exception", "time": end + 0.5, "where": "train.py:9 (<module>)",
             "exception": "RuntimeError: [pair.cc:553] Read error [10.0.0.2]:4711: Connection reset by peer"},
         1: {"code": 1, "reason": "exception", "time": end + 0.52, "where": "train.py:9 (<module>)",
             "exception": "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:4712"},
         2: {"code": 143, "reason": "terminated", "time": end + 0.25},
         3: {"code": 143, "reason": "terminated", "time": end + 0.26}})


def test_the_first_cause_across_hosts_is_found_on_one_clock(tmp_path):
    run = two_host_stop(tmp_path / "run", ahead=3.0)
    # The wrappers' handshake: vm-2's clock is 3 s ahead of vm's, within a millisecond.
    (run / "hosts/vm-2/clock.json").write_text(json.dumps(
        {"measurements": [{"peer": "vm", "offset_s": 3.0004, "uncertainty_s": 0.0008, "rounds": 12, "at": T0}]}))
    report = analyze(run, run, ["json"], workers=1)
    first = report["findings"][0]
    assert (first["kind"], first["severity"], first["ranks"]) == ("interrupted", "critical", [2, 3])
    assert first["explanation"].startswith("host vm-2 was stopped by SIGTERM at ")
    assert ("Then ranks 0, 1 on vm failed with connection errors (Connection reset by peer): they lost their "
            "peers, a consequence, not a fault of their own.") in first["explanation"]
    assert not [f for f in report["findings"] if f["kind"] == "crash"]
    exits = {int(r): e for r, e in json.loads((run / "analysis/hang.json").read_text())["exits"].items()}
    assert exits[2]["time"] == pytest.approx(T0 + 3.25 - 0.0004)  # vm-2's records, on vm's clock
    # Without the handshake vm-2's stop reads 3 s late, after the connection errors it caused.
    (run / "hosts/vm-2/clock.json").unlink()
    report = analyze(run, run, ["json"], workers=1)
    assert report["findings"][0]["kind"] == "crash" and "lost its connection" in report["findings"][0]["explanation"]
    assert any(h["check"] == "clocks" and h["severity"] == "warning" for h in report["health"])


def test_a_lost_host_is_the_cause_and_the_run_abandoned(tmp_path):
    run = two_host_stop(tmp_path / "run", ahead=0.0)
    record = json.loads((run / "hosts/vm-2/host.json").read_text())
    (run / "hosts/vm-2/host.json").write_text(json.dumps({**record, "status": "running", "ended_at": None}))
    for rank in (2, 3):  # killed with their wrapper: no exit records
        (run / f"ranks/{rank}/exit.json").unlink()
    # On another machine (the process cannot be checked here), a heartbeat this old means gone; it
    # was last seen at the end of step 6, before ranks 0 and 1 lost their connections.
    report = analyze(run, run, ["json"], workers=1)
    assert report["run"]["status"] == "abandoned"
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("host_lost", [2, 3]) and "host vm-2 was lost" in first["explanation"]
    assert [h["message"] for h in report["health"] if h["check"] == "hosts"] == [
        "host vm-2's record never ended: its wrapper is gone (last seen 14:13:23 UTC); what it collected until then "
        "is analyzed"]
    # ... while a fresh heartbeat is a host still running.
    (run / "hosts/vm-2/heartbeat").write_text(json.dumps({"seq": 9, "time": time.time() - 5}))
    assert {h["name"]: h["status"] for h in read_hosts(run)}["vm-2"] == "running"


def flight_recorder(rank: int, seqs: int) -> dict:
    """A gloo flight-recorder dump (torch 2.13): every collective recorded, state always scheduled."""
    return {"version": "2.10", "pg_config": {}, "entries": [
        {"record_id": s, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": s, "p2p_seq_id": 0,
         "op_id": s, "profiling_name": "gloo:all_reduce", "time_created_ns": int((T0 + s * STEP_S) * 1e9),
         "input_sizes": [[16]], "input_dtypes": ["Float"], "output_sizes": [[16]], "output_dtypes": ["Float"],
         "state": "scheduled", "is_p2p": False, "retired": False, "timeout_ms": 600000, "frames": []}
        for s in range(1, seqs + 1)]}


@pytest.mark.parametrize("stalled_s,kind", [(0.3, "interrupted"), (120.0, "hang")])
def test_an_interrupted_run_is_a_hang_only_after_a_long_stall(tmp_path, stalled_s, kind):
    end = T0 + 6 * STEP_S
    run = fake_host_run(tmp_path / "run", {"vm": 0.0}, {0: "vm", 1: "vm"}, {"vm": "interrupted"},
                        {0: {"code": 130, "reason": "interrupted", "time": end + stalled_s + 0.1},
                         1: {"code": 130, "reason": "interrupted", "time": end + stalled_s + 0.1}})
    record = json.loads((run / "hosts/vm/host.json").read_text())
    record["interrupted"] = {"signal": "SIGINT", "time": end + stalled_s}
    (run / "hosts/vm/host.json").write_text(json.dumps(record))
    # Rank 0 entered all-reduce #7, rank 1 never did: where each was stopped, or a hang.
    (run / "ranks/0/flight_recorder.json").write_text(json.dumps(flight_recorder(0, 7)))
    (run / "ranks/1/flight_recorder.json").write_text(json.dumps(flight_recorder(1, 6)))
    report = analyze(run, run, ["json"], workers=1)
    found = [f for f in report["findings"] if f["kind"] in ("hang", "interrupted")]
    assert [f["kind"] for f in found] == [kind]
    if kind == "hang":
        assert found[0]["severity"] == "critical" and "rank 1 never entered all_reduce #7" in found[0]["explanation"]
        assert "interrupted after 120 s without a finished step" in found[0]["explanation"]
    else:
        assert found[0]["severity"] == "info" and "host vm was stopped by SIGINT" in found[0]["explanation"]


def test_handshakes_chain_to_the_reference_host():
    measured = {
        "b": [{"peer": "a", "offset_s": 2.0, "uncertainty_s": 0.001}],  # b - a
        "c": [{"peer": "b", "offset_s": -0.5, "uncertainty_s": 0.002},  # c - b
              {"peer": "a", "offset_s": -1.0, "uncertainty_s": 0.2}],  # c - a, a poor round trip
    }
    offsets = clocks.handshake_offsets(measured, "a")
    assert offsets["b"] == (-2.0, 0.001, [])
    offset, uncertainty, via = offsets["c"]  # through b: 1.5 s ahead of a, within 3 ms
    assert (round(offset, 6), round(uncertainty, 6), via) == (-1.5, 0.003, ["b"])
    assert clocks.handshake_offsets(measured, "c")["a"][0] == pytest.approx(1.5)


def test_the_handshake_between_two_wrappers(tmp_path):
    """Two ClockSync ends in one process (one clock): the offset found is zero within its bound."""
    from diagtrain.profiler.collect.clock_sync import ClockSync

    for host in ("a", "b"):
        (tmp_path / "hosts" / host).mkdir(parents=True)
    a, b = ClockSync(tmp_path, "a"), ClockSync(tmp_path, "b")
    b.measure("a")
    deadline = time.monotonic() + 30
    while "a" not in b.results and time.monotonic() < deadline:
        a.step()
        b.step()
        time.sleep(0.0005)
    m = b.results["a"]
    assert m.rounds >= 8 and abs(m.offset_s) <= m.uncertainty_s < 0.05
    assert json.loads((tmp_path / "hosts/b/clock.json").read_text())["measurements"][0]["peer"] == "a"


def test_a_second_wrapper_joins_the_run_of_a_running_one(tmp_path):
    """The join path: a wrapper that finds a running host in --out takes the next folder and says whom it joins."""
    first, running = manifest.join(tmp_path, "vm")
    assert (first.name, running) == ("vm", [])
    manifest.write_host(first, manifest.host_record(first, ["train"], ["diagtrain", "run"], time.time()))
    second, running = manifest.join(tmp_path, "vm")
    assert (second.name, running) == ("vm-2", ["vm"])
    # A record whose wrapper is gone is not a run to join: it is abandoned.
    record = json.loads((first / "host.json").read_text())
    record["process"]["start_ticks"] += 1  # another process that once had this pid
    manifest.write_host(first, record)
    third, running = manifest.join(tmp_path, "vm")
    assert (third.name, running) == ("vm-3", [])


@pytest.mark.parametrize("traces_ahead_s,applied_s", [(2.0003, -2.0003), (2.003, -2.0005)])
def test_collective_end_times_pick_the_offset_within_the_handshakes_bound(traces_ahead_s, applied_s):
    """Host b's collectives end ``traces_ahead_s`` later by its clock; its handshake says 2 s ± 0.5 ms."""
    ends = [T0 + i for i in range(5)]
    collectives = pd.DataFrame(
        [{"rank": rank, "group": "0:0,1", "op": "all_reduce", "seq": i, "ranks_seen": 2, "dur": 100.0,
          "ts": (end + (traces_ahead_s if rank else 0.0)) * 1e6 - 100.0} for rank in (0, 1) for i, end in enumerate(ends)])
    measured = {"b": [{"peer": "a", "offset_s": 2.0, "uncertainty_s": 0.0005}]}
    clock = clocks.host_clocks(collectives, {0: "a", 1: "b"}, measured)["b"]
    assert clock.source == "traces" and clock.traces_s == pytest.approx(-traces_ahead_s)
    assert clock.offset_s == pytest.approx(applied_s)  # never outside what the handshake proved
    # Without a handshake the traces alone decide.
    assert clocks.host_clocks(collectives, {0: "a", 1: "b"}, {})["b"].offset_s == pytest.approx(-traces_ahead_s)
