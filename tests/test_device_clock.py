"""The rank's device view without a GPU: CUDA events and flight-recorder entries as recorded values."""

import json
import time
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np
import pytest
import torch

from diagtrain.profiler.analyzer.read.flight_records import read_dump
from diagtrain.profiler.rank import device_colls, instrument
from diagtrain.profiler.rank.device_clock import DeviceClock
from diagtrain.profiler.rank.device_colls import CollectiveTimes, collective_entries
from diagtrain.profiler.rank.instrument import StepRecorder
from diagtrain.profiler.rank.peak_memory import PeakMemory

FR_FIXTURE = Path(__file__).parent / "fixtures/public/flight_recorder/nvrx_gpu_error_2nd/_dump_8"


class FakeEvent:
    """A recorded event at device time ``at`` (ms); complete once the device has got that far."""

    def __init__(self, device: "FakeDevice", at: float) -> None:
        self.device, self.at = device, at

    def query(self) -> bool:
        self.device.queries += 1
        return self.at <= self.device.done_ms

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "elapsed_time of an event not complete"
        return end.at - self.at


class FakeDevice:
    """The stream's timeline: where the next event lands (``at_ms``) and how far the device has run
    (``done_ms``); while the host sleeps (polls at the end) the device runs on, unless ``stuck``."""

    def __init__(self) -> None:
        self.at_ms, self.done_ms, self.queries, self.host_s, self.stuck = 0.0, 0.0, 0, 0.0, False
        self.capturing = False
        self.current = 0  # torch.cuda.current_device(): the job never set it

    def record(self) -> FakeEvent | None:
        return None if self.capturing else FakeEvent(self, self.at_ms)

    def sleep(self, seconds: float) -> None:
        self.host_s += seconds
        if not self.stuck:
            self.done_ms += seconds * 1e3

    def clock(self, **kw) -> DeviceClock:
        return DeviceClock(self.record, sleep=self.sleep, now=lambda: self.host_s, **kw)


class SwitchDevice:
    """``torch.cuda.device(index)``: the current device of ``state`` (a FakeDevice) is ``index`` for a while."""

    def __init__(self, state, index) -> None:
        self.state, self.index = state, index

    def __enter__(self) -> None:
        self.before, self.state.current = self.state.current, self.index

    def __exit__(self, *exc) -> None:
        self.state.current = self.before


def _run_steps(dev: FakeDevice, clock: DeviceClock, steps: list[tuple[float, float]], first: int = 1) -> None:
    """Each step as (device time its first work is queued at, device time its end is queued at)."""
    for n, (work, end) in enumerate(steps, start=first):
        dev.at_ms = work
        clock.work_begins("data")  # host-side phase: no event
        clock.work_begins("forward")
        clock.work_begins("backward")  # only the first work phase counts
        dev.at_ms = end
        clock.step_ended(n)


def test_host_ahead_no_idle_and_device_step_time():
    dev = FakeDevice()
    clock = dev.clock()
    _run_steps(dev, clock, [(0, 100), (100, 180), (180, 300)])
    dev.done_ms = 1000
    assert clock.take() == [{"step": 1, "step_ms": 100.0, "idle_before_ms": 0.0},
                            {"step": 2, "step_ms": 80.0, "idle_before_ms": 0.0},
                            {"step": 3, "step_ms": 120.0, "idle_before_ms": 0.0}]


def test_host_late_50ms_is_device_idle_before_the_step():
    dev = FakeDevice()
    clock = dev.clock()
    _run_steps(dev, clock, [(0, 100), (150, 250), (300, 400)])  # the host queues each step 50 ms late
    dev.done_ms = 1000
    got = clock.take()
    assert [s["idle_before_ms"] for s in got] == [0.0, 50.0, 50.0]
    assert [s["step_ms"] for s in got] == [100.0, 100.0, 100.0]  # the device's busy time, idle excluded


def test_a_step_without_a_work_phase_starts_at_the_previous_end():
    dev = FakeDevice()
    clock = dev.clock()
    dev.at_ms = 100
    clock.step_ended(1)
    dev.at_ms = 220
    clock.step_ended(2)
    dev.done_ms = 1000
    assert clock.take() == [{"step": 1, "step_ms": 100.0, "idle_before_ms": 0.0},
                            {"step": 2, "step_ms": 120.0, "idle_before_ms": 0.0}]


def test_steps_not_complete_stay_pending_and_nothing_blocks():
    dev = FakeDevice()
    clock = dev.clock()
    _run_steps(dev, clock, [(0, 100), (100, 200), (200, 300)])
    dev.done_ms = 150  # the device is inside step 2
    assert [s["step"] for s in clock.take()] == [1]
    assert clock.take() == []
    dev.done_ms = 300
    assert [s["step"] for s in clock.take()] == [2, 3]
    assert dev.host_s == 0  # take() polled and returned, it never waited


def test_pending_steps_are_bounded_and_the_dropped_counted():
    dev = FakeDevice()
    clock = dev.clock(max_pending=4)
    _run_steps(dev, clock, [(i * 10, i * 10 + 10) for i in range(6)])  # the device has run none of them
    assert clock.take() == [] and clock.dropped == 2
    dev.done_ms = 1000
    assert [s["step"] for s in clock.take()] == [3, 4, 5, 6]


def test_flush_polls_the_pending_steps_until_they_complete():
    dev = FakeDevice()
    clock = dev.clock()
    assert clock.flush(5.0) == [] and dev.host_s == 0
    _run_steps(dev, clock, [(0, 100), (100, 200)])
    assert [s["step"] for s in clock.flush(5.0)] == [1, 2]
    assert 0.19 <= dev.host_s <= 0.21 and clock.unfinished == 0  # waited as long as the device took, no longer


def test_flush_of_a_device_that_never_gets_there_gives_up_in_time():
    dev = FakeDevice()
    clock = dev.clock()
    _run_steps(dev, clock, [(0, 100), (100, 200)])
    dev.done_ms, dev.stuck = 100, True  # a collective whose peer is gone
    assert [s["step"] for s in clock.flush(2.0)] == [1]
    assert 2.0 <= dev.host_s <= 2.01 and clock.unfinished == 1
    assert clock.flush(2.0) == []  # given up: nothing left pending


def test_steps_during_a_cuda_graph_capture_are_left_untimed():
    dev = FakeDevice()
    clock = dev.clock()
    _run_steps(dev, clock, [(0, 100)])
    dev.capturing = True  # the program captures step 2 in a CUDA graph: no event may be recorded
    _run_steps(dev, clock, [(100, 200)], first=2)
    dev.capturing = False
    _run_steps(dev, clock, [(200, 300), (300, 400)], first=3)
    dev.done_ms = 1000
    assert [(s["step"], s["step_ms"]) for s in clock.take()] == [(1, 100.0), (4, 100.0)]


# -- collectives: flight-recorder entries as torch 2.13 writes them ----------------------------------


def _entry(seq: int, created_ns: int, ms: float | None = 1.5, state: str = "completed", group: str = "0",
           **kw) -> dict:
    return {"collective_seq_id": seq, "process_group": [group, "default_pg"], "profiling_name": "nccl:all_reduce",
            "time_created_ns": created_ns, "state": state, "duration_ms": ms, "is_p2p": False, **kw}


def _steps_at(starts: dict[int, int]):
    def step_of(ns: int):
        found = [s for s, start in starts.items() if start <= ns]
        return max(found) if found else None
    return step_of


def test_real_entries_without_timing_give_nothing():
    entries = read_dump(FR_FIXTURE)["entries"]  # a real NCCL dump: scheduled, untimed collectives
    assert entries and collective_entries(entries, OrderedDict(), lambda ns: 1) == []


def test_completed_timed_entries_become_device_colls_with_their_step():
    real = read_dump(FR_FIXTURE)["entries"][0]
    t0 = real["time_created_ns"]
    timed = {**real, "state": "completed", "duration_ms": 3.25}  # the same entry once complete and timed
    entries = [timed, _entry(7, t0 + 2_000, 1.0), _entry(8, t0 + 5_000, 2.0),
               _entry(9, t0 + 6_000, 9.0, state="started"), _entry(10, t0 + 6_000, None),
               _entry(0, t0 + 6_000, 4.0, is_p2p=True), _entry(11, t0 - 1, 1.0)]
    got = collective_entries(entries, OrderedDict(), _steps_at({4: t0, 5: t0 + 4_000}))
    assert got == [{"step": 4, "group": "72", "seq": real["collective_seq_id"], "op": "nccl:all_to_all", "ms": 3.25},
                   {"step": 4, "group": "0", "seq": 7, "op": "nccl:all_reduce", "ms": 1.0},
                   {"step": 5, "group": "0", "seq": 8, "op": "nccl:all_reduce", "ms": 2.0}]


def test_an_entry_is_written_once_and_the_seen_set_is_bounded(monkeypatch):
    monkeypatch.setattr(device_colls, "MAX_SEEN", 3)
    seen: OrderedDict = OrderedDict()
    first = collective_entries([_entry(s, 10) for s in (1, 2)], seen, lambda ns: 1)
    again = collective_entries([_entry(s, 10) for s in (1, 2, 3)], seen, lambda ns: 1)
    assert [c["seq"] for c in first] == [1, 2] and [c["seq"] for c in again] == [3]
    collective_entries([_entry(4, 10)], seen, lambda ns: 1)
    assert list(seen) == [("0", 2), ("0", 3), ("0", 4)]


# -- the recorder on a CUDA device, its CUDA calls replaced by recorded values ------------------------


def _counted(calls: dict, name: str, result=None):
    def call(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return result() if callable(result) else result
    return call


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as a CUDA rank sees it: counted synchronize, peak resets, allocator reads (by device) and
    recorder dumps; the current device 0, the current stream capturing a graph while ``dev.capturing``."""
    dev, calls = FakeDevice(), {"synchronize": 0, "reset_peak": 0, "allocator_reads": 0, "dumps": 0}
    stats = {"allocated_bytes.all.peak": 7 * 2**20}
    nested = {"allocated_bytes": {"all": {"current": 2**20, "peak": 7 * 2**20}},
              "reserved_bytes": {"all": {"current": 8 * 2**20}}}
    calls["stats_devices"] = []

    def read(result):
        def stats_of(device=None):
            calls["allocator_reads"] += 1
            calls["stats_devices"].append(device)
            return result
        return stats_of

    monkeypatch.setattr(torch.cuda, "synchronize", _counted(calls, "synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", _counted(calls, "reset_peak"))
    monkeypatch.setattr(torch.cuda, "memory_stats", read(stats))
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", read(nested))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: dev.capturing)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: dev.current)
    monkeypatch.setattr(torch.cuda, "device", lambda index: SwitchDevice(dev, index))

    def clock(torch_, device, **kw):
        calls["clock_device"] = device
        return dev.clock(**kw)

    monkeypatch.setattr(instrument, "cuda_clock", clock)
    fr = {"entries": []}
    monkeypatch.setattr(instrument, "nccl_dump", lambda torch_: _counted(calls, "dumps", lambda: json.loads(json.dumps(fr))))
    return dev, calls, fr


def test_a_cuda_rank_records_device_steps_without_synchronize_and_flushes_at_close(tmp_path, fake_cuda):
    dev, calls, fr = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        for step in range(1, 4):
            with rec.phase("data"):
                pass
            dev.at_ms = (step - 1) * 100 + 30  # the host queues its work 30 ms after the device went idle
            with rec.phase("forward"):
                pass
            dev.at_ms = step * 100
            dev.done_ms = (step - 1) * 100  # the device ends each step a step behind the host
            fr["entries"].append(_entry(step, time.time_ns(), 2.0))  # issued during this step
            rec.step()
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    steps, tail = lines[:-1], lines[-1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["device_source"] == "cuda_events" for r in steps)
    assert [[d["step"] for d in r["device_steps"]] for r in steps] == [[], [1], [2]]
    assert steps[1]["device_steps"][0] == {"step": 1, "step_ms": 70.0, "idle_before_ms": 30.0}
    assert calls["synchronize"] == 0  # none per step, none at close
    assert "step" not in tail and tail["kind"] == "device" and tail["rank"] == 0
    assert tail["device_steps"] == [{"step": 3, "step_ms": 70.0, "idle_before_ms": 30.0}]
    # Read at the end of step 2 (the first reads: every 2 steps on every rank), into step 3's record; then at close.
    assert ["device_colls" in r for r in steps] == [False, False, True]
    assert [(c["step"], c["seq"]) for c in steps[2]["device_colls"] + tail["device_colls"]] == [(1, 1), (2, 2), (3, 3)]
    assert calls["reset_peak"] == 0
    assert {r["mem_source"] for r in steps} == {"cuda_lifetime_peak"}
    assert {r["peak_mem_bytes"] for r in steps} == {7 * 2**20}
    assert {r["gpu_peak_since"] for r in steps} == {"start"}


@pytest.mark.usefixtures("fake_cuda")
def test_a_failing_device_clock_is_said_once_and_training_goes_on(tmp_path, capsys):
    def broken(*a):
        raise RuntimeError("CUDA error: an illegal memory access")

    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        rec._clock.step_ended = broken
        for _ in range(3):
            rec.step()
    records = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert not any("device_steps" in r for r in records)
    assert capsys.readouterr().err.count("device times are not recorded") == 1


def test_peak_memory_on_cuda_is_the_allocators_peak_read_without_resetting(monkeypatch):
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: resets.append(a))
    memory = PeakMemory(torch.device("cuda", 0))
    memory.reset()
    assert memory.read(123) == 123 and memory.source == "cuda_lifetime_peak" and resets == []
    assert memory.read(None) is None  # the allocator was not read this step (a graph capture)



def test_the_rank_dump_holds_the_nccl_recorders_entries_and_the_generic_ones(tmp_path, monkeypatch):
    from diagtrain.profiler.rank import flight_recorder

    c10d = torch._C._distributed_c10d
    nccl = {"version": "2.10", "pg_config": {"0": {"desc": "default_pg"}}, "entries": [_entry(1, 5, 2.0)]}
    generic = {"version": "2.10", "pg_config": {"1": {"desc": "gloo_pg"}}, "entries": [_entry(1, 6, None, group="1")]}
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", lambda *a: json.dumps(nccl).encode(), raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace_json", lambda *a: json.dumps(generic).encode())
    assert flight_recorder.dump(tmp_path / "fr.json")
    dumped = json.loads((tmp_path / "fr.json").read_text())
    assert [(e["process_group"][0], e["duration_ms"]) for e in dumped["entries"]] == [("0", 2.0), ("1", None)]
    assert set(dumped["pg_config"]) == {"0", "1"}


def test_a_recorder_both_dump_functions_read_has_each_entry_once_in_the_rank_dump(tmp_path, monkeypatch):
    """A PyTorch that unifies the generic and NCCL recorders: both functions dump the same entries (the later
    dump has moved on: the entry it still saw in progress has completed since)."""
    from diagtrain.profiler.rank import flight_recorder

    c10d = torch._C._distributed_c10d
    first = [{**_entry(s, 5 + s, None, state="started"), "record_id": s} for s in (1, 2)]
    later = [{**e, "state": "completed", "duration_ms": 2.0} for e in first] + [{**_entry(3, 8), "record_id": 3}]
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", lambda *a: json.dumps({"entries": first}).encode(), raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace_json", lambda *a: json.dumps({"entries": later}).encode())
    assert flight_recorder.dump(tmp_path / "fr.json")
    dumped = json.loads((tmp_path / "fr.json").read_text())["entries"]
    assert [(e["record_id"], e["state"]) for e in dumped] == [(1, "completed"), (2, "completed"), (3, "completed")]


def test_a_plain_scripts_recorder_starts_the_device_clock_at_the_counters_first_work_phase(tmp_path, fake_cuda):
    from diagtrain.profiler.rank.counters import COUNTERS

    dev, calls, _ = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0), implicit=True) as rec:
        for step in (1, 2):
            COUNTERS.phases.enter("data")  # the DataLoader, as the counters time it
            COUNTERS.phases.exit("data")
            dev.at_ms = (step - 1) * 100 + 40
            COUNTERS.phases.enter("forward")
            COUNTERS.phases.exit("forward")
            dev.at_ms = step * 100
            rec.begin_phase("optimizer")  # the optimizer hooks
            rec.end_phase("optimizer")
            rec.step()
    assert COUNTERS.phases.on_enter is None  # the clock is gone with its recorder
    tail = json.loads((tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()[-1])
    assert tail["device_steps"] == [{"step": 1, "step_ms": 60.0, "idle_before_ms": 40.0},
                                    {"step": 2, "step_ms": 60.0, "idle_before_ms": 40.0}]
    assert calls["synchronize"] == 0


def test_after_an_error_the_end_does_not_wait_for_the_device(tmp_path, fake_cuda):
    dev, calls, _ = fake_cuda
    with pytest.raises(RuntimeError, match="the job's own error"), \
            StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        for step in (1, 2):
            dev.at_ms = step * 100
            rec.step()
        dev.done_ms = 100  # step 2 never completes: a collective whose peer died
        raise RuntimeError("the job's own error")
    tail = json.loads((tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()[-1])
    assert tail["kind"] == "device" and [s["step"] for s in tail["device_steps"]] == [1]
    assert dev.host_s == 0 and calls["synchronize"] == 0


def test_the_flight_recorder_is_read_between_steps_and_its_failure_leaves_the_steps(tmp_path, fake_cuda, capsys):
    dev, _, fr = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        fr["entries"].append(_entry(1, time.time_ns(), 2.0))
        dev.at_ms = 100  # the device never gets to the steps' ends while they run
        rec.step()
        rec.step()  # a read at the end of step 2: it goes into step 3's record
        fr["entries"] = [{"state": "completed", "duration_ms": 1.0, "process_group": ["0", ""]}]  # no seq: unreadable
        for _ in range(3):
            rec.step()  # the read at the end of step 4 fails: the collectives stand down, the steps go on
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert ["device_colls" in r for r in lines[:5]] == [False, False, True, False, False]
    assert lines[2]["device_colls"][0]["seq"] == 1
    assert [s["step"] for s in lines[5]["device_steps"]] == [1, 2, 3, 4, 5] and lines[5]["device_colls"] == []
    assert capsys.readouterr().err.count("collectives' device times are not recorded") == 1


def test_a_cpu_rank_records_exactly_as_before(tmp_path):
    with StepRecorder(tmp_path, rank=0) as rec:
        for _ in range(3):
            with rec.phase("forward"):
                pass
            rec.step()
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]  # no end-of-run device line
    assert not any(k.startswith("device_") for r in lines for k in r)
    assert {r["mem_source"] for r in lines} <= {"rss_peak", "rss_lifetime_peak"}


# -- a CUDA graph captured by the program: nothing of diagtrain's touches CUDA meanwhile (issue 61) ----------------


def test_nothing_touches_cuda_while_the_program_captures_a_graph(tmp_path, fake_cuda):
    """PyTorch's whole-network capture runs optimizer.step() inside the capture: the hooks' step ends then. An event
    queried, the recorder dumped (it queries events) or the allocator read during it would break the job."""
    dev, calls, fr = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        dev.at_ms = 100
        rec.step()  # step 1, eager (the capture recipe's warm-up)
        fr["entries"].append(_entry(1, time.time_ns(), 2.0))
        dev.capturing, dev.done_ms = True, 1000  # step 1 done on the device
        before = (dev.queries, calls["dumps"], calls["allocator_reads"])
        rec.step()  # step 2: its end, where a read of the recorder is due, comes inside the capture
        assert (dev.queries, calls["dumps"], calls["allocator_reads"]) == before
        dev.capturing = False  # the capture ended: replays follow, then eager steps again
        dev.at_ms = 300
        rec.step()
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert lines[1]["device_steps"] == [] and "gpu_allocated_bytes" not in lines[1]
    assert lines[1]["peak_mem_bytes"] is None  # unknown, not a peak of 0
    assert [d["step"] for d in lines[2]["device_steps"]] == [1]  # taken once the capture had ended
    assert [c["seq"] for c in lines[3]["device_colls"]] == [1] and lines[2]["gpu_peak_bytes"] == 7 * 2**20


def test_the_capture_check_asks_the_ranks_own_device_when_it_is_not_the_current_one(monkeypatch):
    from diagtrain.profiler.rank.device_clock import graph_capture

    state, switched = FakeDevice(), []
    capturing_on = {3}

    def switch(index):
        switched.append(index)
        return SwitchDevice(state, index)

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state.current in capturing_on)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.current)
    monkeypatch.setattr(torch.cuda, "device", switch)
    assert graph_capture(torch.cuda, torch.device("cuda", 3))() and state.current == 0
    assert not graph_capture(torch.cuda, torch.device("cuda", 2))()
    switched.clear()
    capturing_on = {0}
    assert graph_capture(torch.cuda, torch.device("cuda", 3))() and switched == []  # the current device's, first


def test_the_allocator_is_read_once_a_step_on_the_ranks_device(tmp_path, fake_cuda):
    _, calls, _ = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 3)) as rec:
        for _ in range(4):
            rec.step()
    assert calls["allocator_reads"] == 4
    assert {str(torch.device(d)) for d in calls["stats_devices"]} == {"cuda:3"}
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert {(r["peak_mem_bytes"], r["gpu_peak_bytes"], r["gpu_allocated_bytes"]) for r in lines if "step" in r} \
        == {(7 * 2**20, 7 * 2**20, 2**20)}


# -- the rank's device: where its parameters are, not the current device (issue 61) ----------------------------


class FakeParameter:
    """A parameter as the hooks see it: on ``device``."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"


def test_a_model_moved_with_to_rank_is_timed_on_its_own_gpu_not_the_current_one(tmp_path, fake_cuda, monkeypatch):
    """PyTorch's DDP tutorial: ``model.to(rank)``, never ``torch.cuda.set_device``: rank 3 trains on cuda:3 while
    the current device stays 0. Its events, allocator statistics and rank.json's GPU are cuda:3's."""
    from types import SimpleNamespace

    from diagtrain.profiler.rank import step_hooks

    _, calls, _ = fake_cuda
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(name=f"GPU {torch.device(device).index}", uuid=f"GPU-{device}"))
    folder = tmp_path / "ranks" / "3"
    folder.mkdir(parents=True)
    (folder / "rank.json").write_text(json.dumps({"rank": 3}))
    optimizer = SimpleNamespace(param_groups=[{"params": [FakeParameter("cuda:3"), FakeParameter("cuda:3")]}])
    hooks = step_hooks._HookRecorder(tmp_path, claim=lambda: 3)
    hooks.rank = 3
    try:
        for _ in range(2):
            hooks._pre_step(optimizer, (), {})
            hooks._post_step(optimizer, (), {})
    finally:
        hooks.close()
    records = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert [r.get("device_source") for r in records if "step" in r] == ["cuda_events", "cuda_events"]
    assert json.loads((folder / "rank.json").read_text())["device"] == "cuda:3"
    assert str(calls["clock_device"]) == "cuda:3"
    assert calls["stats_devices"] and {str(torch.device(d)) for d in calls["stats_devices"]} == {"cuda:3"}


def test_the_ranks_device_is_its_optimizers_first_cuda_parameter_else_its_modules():
    from types import SimpleNamespace

    from diagtrain.profiler.rank.step_hooks import rank_device

    on_cpu = SimpleNamespace(param_groups=[{"params": [FakeParameter("cpu")]}])  # state offloaded to the CPU
    mixed = SimpleNamespace(param_groups=[{"params": [FakeParameter("cpu")]}, {"params": [FakeParameter("cuda:5")]}])
    module = SimpleNamespace(parameters=lambda: iter([FakeParameter("cpu"), FakeParameter("cuda:2")]))
    assert rank_device(mixed, [module]) == torch.device("cuda", 5)
    assert rank_device(on_cpu, [module]) == torch.device("cuda", 2)
    assert rank_device(on_cpu, []) is None  # a CPU job: no device view


# -- AMP's GradScaler skips optimizer.step() on inf or NaN gradients (issue 61) ----------------------------------------


def test_a_step_the_grad_scaler_skipped_ends_its_own_step_marked(tmp_path, monkeypatch):
    """A real GradScaler (on the CPU) skips the step whose gradients hold an inf: the optimizer's hooks never fire
    then, and without GradScaler's call followed that iteration would merge into the next."""
    from torch.amp.grad_scaler import GradScaler
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from diagtrain.profiler.rank import step_hooks

    folder = tmp_path / "ranks" / "0"
    folder.mkdir(parents=True)
    (folder / "rank.json").write_text(json.dumps({"rank": 0}))
    hooks = step_hooks._HookRecorder(tmp_path, claim=lambda: 0)
    hooks.rank = 0
    monkeypatch.setattr(GradScaler, "_maybe_opt_step", step_hooks.follow_skipped_steps(GradScaler._maybe_opt_step, hooks))
    handles = [register_optimizer_step_pre_hook(hooks._pre_step), register_optimizer_step_post_hook(hooks._post_step)]
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    try:
        for iteration in (1, 2, 3):
            scaler.scale(model(torch.ones(2, 4)).sum()).backward()
            if iteration == 2:
                model.weight.grad[0, 0] = float("inf")  # an overflow: this step is skipped
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    finally:
        for handle in handles:
            handle.remove()
        hooks.close()
    records = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("optimizer_skipped", False)) for r in records] == [(1, False), (2, True), (3, False)]


# -- the environment every rank starts with (issue 61) -----------------------------------------------------------------


@pytest.mark.parametrize("user, added, entries", [
    ({}, {"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_FR_BUFFER_SIZE": "20000"}, 20_000),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}, {"TORCH_NCCL_ENABLE_TIMING": "1"}, 500),  # the older name: kept
    ({"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_ENABLE_TIMING": "0"}, {}, 64),
    ({"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}, {"TORCH_NCCL_ENABLE_TIMING": "1"}, 64),
], ids=["nothing set", "the old name set", "both set", "both names"])
def test_the_wrapper_gives_every_child_the_timing_and_recorder_size_keeping_the_users(tmp_path, monkeypatch,
                                                                                       user, added, entries):
    """Set in the command's environment before it starts, so that a process that becomes a rank at its own
    init_process_group (mp.spawn's children) has them when its process group reads them; PyTorch reads the
    first recorder name set, so a user's value under either name means setting neither."""
    from types import SimpleNamespace

    from diagtrain.profiler.collect import manifest
    from diagtrain.profiler.collect.launcher import Collection
    from diagtrain.profiler.run_dir import recorder_entries

    for name in ("TORCH_NCCL_ENABLE_TIMING", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    host = tmp_path / "hosts" / "node-a"
    host.mkdir(parents=True)
    wrapper = SimpleNamespace(out=tmp_path, host_dir=host, bootstrap_dir=tmp_path / "bootstrap")
    env, said = Collection._child_env(wrapper, "none")
    assert said == added and {k: env[k] for k in user} == user
    assert recorder_entries(env) == entries  # what the ranks' recorder holds, as PyTorch reads it
    record = {**manifest.host_record(host, ["train.py"], ["diagtrain", "run"], 0.0, env), "env_added": said}
    manifest.write_host(host, record)
    written = manifest.build(tmp_path)
    assert written["env_added"] == added and {**user, **added}.items() <= written["env"].items()


# -- the recorder's reads: the same steps on every rank, the ring never wrapping unnoticed (issue 61) -----------------


class FakeRing:
    """ProcessGroupNCCL's flight recorder as its JSON dump shows it: the last ``size`` entries, record ids counting
    up from 0, each collective timed and retired; a dump costs the host ``cost_s`` for a full ring (less for fewer)."""

    def __init__(self, size: int, cost_s: float, clock: list) -> None:
        self.size, self.cost_s, self.clock = size, cost_s, clock
        self.entries: deque = deque(maxlen=size)
        self.issued = 0

    def issue(self, count: int, created_ns: int) -> None:
        for _ in range(count):
            self.issued += 1
            self.entries.append({**_entry(self.issued, created_ns, 1.0), "record_id": self.issued - 1, "retired": True})

    def dump(self) -> dict:
        self.clock[0] += self.cost_s * len(self.entries) / self.size
        return {"version": "2.10", "entries": [dict(e) for e in self.entries], "pg_config": {}}


def _train(steps: int, step_s: float, per_step: float, ring: FakeRing, times: CollectiveTimes, t0: float = 0.0):
    """``steps`` steps of ``step_s`` host seconds, ``per_step`` collectives each (on average); the steps at whose end
    the rank read its recorder, and what it recorded (collectives, lost spans)."""
    reads, colls, lost = [], [], []
    for step in range(1, steps + 1):
        start_ns = int((t0 + ring.clock[0]) * 1e9)
        times.step_began(step, start_ns)
        ring.clock[0] += step_s
        ring.issue(int(step * per_step) - int((step - 1) * per_step), start_ns + 1)
        before = ring.clock[0]
        times.step_ended(step)
        if ring.clock[0] != before:
            reads.append(step)
        found = times.take()
        colls += found.get("device_colls", [])
        lost += found.get("device_colls_lost", [])
    return reads, colls, lost


def test_two_ranks_on_their_own_clocks_read_the_recorder_at_the_same_steps():
    """Rank 1's host is busier (its reads cost twice rank 0's) and its clock runs elsewhere: before, each read on its
    own clock, at steps of its own, and the job stalled once per rank. Now the steps of the longer interval are
    among those of the shorter: wherever rank 1 stalls, rank 0 stalls too, and the job pays one stall a read."""
    found = {}
    for rank, cost_s, t0 in ((0, 0.3, 1_790_000_000.0), (1, 0.6, 1_790_000_123.4)):
        clock = [0.0]
        ring = FakeRing(4_000, cost_s, clock)
        times = CollectiveTimes(ring.dump, 4_000, clock=lambda clock=clock: clock[0])
        found[rank] = _train(12_000, 0.1, 1.0, ring, times, t0)  # the ring full by step 4,000
    reads0, reads1 = found[0][0], found[1][0]
    assert set(reads1) <= set(reads0) and reads0[:2] == reads1[:2] == [2, 4]
    full0, full1 = [s for s in reads0 if s > 4_096], [s for s in reads1 if s > 4_096]
    assert set(np.diff(full0)) == {1_024} and set(np.diff(full1)) == {2_048}  # a full ring's read: 0.3 s and 0.6 s
    # The job's stall: one per read step, the slowest reader's: within the budget of 0.5% of those steps.
    stall = sum(0.6 if s in reads1 else 0.3 for s in full0)
    assert stall / (0.1 * (full0[-1] - full0[0] + 1_024)) <= 0.005
    for rank in (0, 1):  # the ring never wrapped between two reads: every collective once, none lost
        _, colls, lost = found[rank]
        assert lost == [] and sorted(c["seq"] for c in colls) == list(range(1, len(colls) + 1))
        assert len(colls) >= 12_000 - 2_048


def test_a_ring_that_wraps_between_reads_has_its_lost_collectives_counted_with_their_steps():
    """200 collectives a step, reads of a full ring that cost 2 s: reading often enough to keep 2,000 entries would
    cost more than the ceiling, so entries are lost. Every collective issued is recorded or counted lost, in its steps."""
    clock = [0.0]
    ring = FakeRing(2_000, 2.0, clock)
    times = CollectiveTimes(ring.dump, 2_000, clock=lambda: clock[0])
    reads, colls, lost = _train(2_000, 0.1, 200, ring, times)
    found = times.finish(2_000)
    colls += found.get("device_colls", [])
    lost += found.get("device_colls_lost", [])
    reads.append(2_000)
    assert lost and len(colls) + sum(span["entries"] for span in lost) == ring.issued
    for span in lost:  # 10 steps' collectives fill the ring: those of the steps from the read before to 10 steps
        # before this one were lost; the span holds them, from the last step read to the first one kept
        before, this = max(s for s in reads if s < span["last_step"]), min(s for s in reads if s >= span["last_step"])
        assert (span["first_step"], span["last_step"]) == (before, this - 9)
        assert span["entries"] == (this - 10 - before) * 200


def test_an_entry_read_in_flight_and_overwritten_before_it_completed_is_lost():
    from diagtrain.profiler.rank.device_colls import LostEntries

    gaps = LostEntries()
    first = [{**_entry(s, 100 + s, None, state="started" if s == 3 else "completed"), "record_id": s, "retired": s != 3}
             for s in range(1, 5)]
    assert gaps.read(first, lambda ns: ns // 100) is None
    later = [{**_entry(s, 200 + s), "record_id": s, "retired": True} for s in range(4, 9)]  # 1-3 overwritten
    assert gaps.read(later, lambda ns: ns // 100) == {"first_step": 1, "last_step": 2, "entries": 1}  # only 3 was unread
    reset = [{**_entry(1, 300), "record_id": 0, "retired": True}]  # the recorder was reset: its ids start again
    assert gaps.read(reset, lambda ns: ns // 100) is None


def test_the_interval_is_the_rings_unless_the_budget_or_the_ceiling_says_otherwise():
    from diagtrain.profiler.rank.device_colls import next_interval

    assert next_interval(0.01, 0.1, 30, 20_000) == 64  # cheap: every 5 s at least (50 steps), rounded to 64
    assert next_interval(0.1, 0.1, 100, 20_000) == 128  # the ring fills in 200 steps: read before 3/4 of it (150)
    assert next_interval(0.3, 0.1, 3, 20_000) == 1024  # a quiet ring: the budget (600 steps) decides
    assert next_interval(2.0, 0.1, 2_000, 20_000) == 2048  # past the ceiling (1%): entries will be lost


def test_a_process_group_that_started_untimed_is_said_once_and_records_no_device_waits(tmp_path, fake_cuda, capsys):
    dev, _, fr = fake_cuda
    with StepRecorder(tmp_path, rank=0, device=torch.device("cuda", 0)) as rec:
        for step in range(1, 7):
            fr["entries"].append({**_entry(step, time.time_ns(), None), "retired": True})  # completed, no duration
            rec.step()
    lines = [json.loads(line) for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert not any(r.get("device_colls") for r in lines)  # no collective times at all: waits unknown, not 0
    assert capsys.readouterr().err.count("NCCL collectives are not timed on the device") == 1


def test_the_nccl_recorder_is_read_pickled_without_stack_traces(monkeypatch):
    """torch's pickled dump costs half the C++ time of its JSON one and decodes in C; stack traces would be
    symbolized for every entry."""
    import pickle
    from types import SimpleNamespace

    from diagtrain.profiler.rank.device_colls import nccl_dump

    asked = []

    def pickled(**kwargs):
        asked.append(kwargs)
        return pickle.dumps({"entries": [_entry(1, 5)]})

    def as_json(*args):
        raise AssertionError("the JSON dump, where a pickled one is to be had")

    c10d = SimpleNamespace(_dump_nccl_trace=pickled, _dump_nccl_trace_json=as_json)
    assert nccl_dump(SimpleNamespace(_C=SimpleNamespace(_distributed_c10d=c10d)))()["entries"] == [_entry(1, 5)]
    assert asked == [{"includeCollectives": True, "includeStackTraces": False, "onlyActive": False}]
    json_only = SimpleNamespace(_dump_nccl_trace_json=lambda *a: json.dumps({"entries": []}))
    assert nccl_dump(SimpleNamespace(_C=SimpleNamespace(_distributed_c10d=json_only)))() == {"entries": []}
