"""What a read of the flight recorder costs a rank, and what the reads cost a job of N ranks (issue 61).

On a CPU host, in one process:

1. The C++ dump the training thread waits for: PyTorch's generic flight recorder holding 20,000 real
   entries (gloo all-reduces of a one-rank world, ``TORCH_FR_BUFFER_SIZE=20000``), pickled without stack
   traces (``_dump_fr_trace``, as diagtrain reads NCCL's with ``_dump_nccl_trace``) and as JSON
   (``_dump_fr_trace_json``, what it read before), and each decoded. The same FlightRecorder code as
   NCCL's, less the two CUDA event queries an NCCL entry adds. Median of ``--reps``.
2. A rank's read as :class:`device_colls.CollectiveTimes` makes it, on a fake NCCL recorder of 20,000
   completed, timed entries (every field torch 2.13 writes) of which the last 15,000 are new since the
   last read: decoded, the new entries found by record id, turned into ``device_colls``, the gap counted.
3. Whether a helper thread would help: a training thread's pace while a helper decodes and filters the
   same dump, for a thread always in Python and for a GPU job's (short Python, then a wait that releases
   the GIL).
4. The job's share of time spent in reads, for N ranks: before, each rank read on its own clock (every
   ``max(5 s, cost / 0.5%)``) and the next collective made every peer wait for each, so the job paid N
   stalls; now every rank reads at the steps of :class:`device_colls.ReadSchedule`, simulated read by
   read for N ranks whose every read costs 1.00-1.25x the measured one (a busier host, at random), 0.1 s
   steps, 100 and 300 collectives a second into a ring of 20,000: the job pays, at each read step, the
   slowest reader's stall.

    python benchmarks/recorder_read.py [--reps 5] [--steps 20000]

Results: benchmarks/results/recorder_read.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

os.environ["TORCH_FR_BUFFER_SIZE"] = "20000"  # before torch: the recorder reads it once
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29561")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, save  # noqa: E402

from diagtrain.profiler.rank import device_colls  # noqa: E402

ENTRIES = 20_000
RANKS = (8, 64, 512, 4096)
RATES = (100, 300)  # collectives a second
STEP_S = 0.1
COST_SPREAD = 0.25  # a read costs 1.00-1.25x the measured one on each rank, drawn anew each read


def median_s(call: Callable[[], object], reps: int) -> tuple[float, object]:
    """The median seconds of ``call()`` over ``reps`` calls, and its last result."""
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def real_dumps(reps: int) -> dict[str, float]:
    """The generic recorder's C++ dump of 20,000 real gloo entries, pickled and as JSON, and their decoding."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(4)
    for _ in range(ENTRIES + 100):
        dist.all_reduce(tensor)
    c10d = torch._C._distributed_c10d
    pickled_s, pickled = median_s(lambda: c10d._dump_fr_trace(True, False, False), reps)
    json_s, as_json = median_s(lambda: c10d._dump_fr_trace_json(True, False), reps)
    unpickle_s, decoded = median_s(lambda: pickle.loads(pickled), reps)
    loads_s, _ = median_s(lambda: json.loads(as_json), reps)
    assert len(decoded["entries"]) == ENTRIES
    dist.destroy_process_group()
    return {"pickled_dump_s": round(pickled_s, 3), "pickled_mb": round(len(pickled) / 1e6, 1),
            "unpickle_s": round(unpickle_s, 3), "json_dump_s": round(json_s, 3), "json_mb": round(len(as_json) / 1e6, 1),
            "json_loads_s": round(loads_s, 3)}


def fake_nccl_entries() -> list[dict]:
    """A 20,000-entry NCCL recorder's entries as torch 2.13 writes them: every collective completed, retired, timed."""
    t0 = 1_790_000_000_000_000_000
    return [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "pt_nccl_watchdg",
             "thread_id": "139686205328256", "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1,
             "profiling_name": "nccl:all_reduce", "time_created_ns": t0 + i * 10**6, "duration_ms": 1.25,
             "input_sizes": [[4096, 1024]], "input_dtypes": ["BFloat16"], "output_sizes": [[4096, 1024]],
             "output_dtypes": ["BFloat16"], "state": "completed", "time_discovered_started_ns": t0 + i * 10**6 + 10**5,
             "time_discovered_completed_ns": t0 + i * 10**6 + 9 * 10**5, "retired": True, "timeout_ms": 600000,
             "is_p2p": False} for i in range(ENTRIES)]


def a_read(pickled: bytes, reps: int) -> float:
    """Median seconds of a rank's read in Python: decode, find the new entries, device_colls, gaps (the last 15,000
    of 20,000 new since the read before)."""
    def read() -> int:
        times = device_colls.CollectiveTimes(lambda: pickle.loads(pickled), ENTRIES)
        times.step_began(1, 0)
        times._lost.read([{"record_id": 4_999, "state": "completed", "retired": True}], lambda ns: 1)  # the read before
        times._seen.update(((("0", i + 1), None) for i in range(5_000)))
        times._read(2)
        return len(times.take().get("device_colls", []))

    seconds, found = median_s(read, reps)
    assert found == 15_000
    return seconds


def parse(pickled: bytes) -> int:
    """What a helper thread would do with one dump: decode, device_colls, gaps."""
    entries = pickle.loads(pickled)["entries"]
    colls = device_colls.collective_entries(entries, OrderedDict(), lambda ns: 1)
    device_colls.LostEntries().read(entries, lambda ns: 1)
    return len(colls)


def python_work() -> None:
    """A training thread's own Python (about 0.1 ms): what competes with the helper for the GIL."""
    for _ in range(20):
        sum(range(50))


def gpu_like_work() -> None:
    """A GPU job's training thread: its Python, then a wait that releases the GIL (a CUDA synchronize, a
    DataLoader queue): 0.1 ms of Python for every 0.3 ms waited."""
    python_work()
    time.sleep(0.0003)


def loop_rate(work: Callable[[], None], seconds: float, stop: threading.Event | None = None) -> float:
    """Iterations a second of ``work`` on this thread, for ``seconds`` or until ``stop`` is set."""
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds and not (stop is not None and stop.is_set()):
        work()
        count += 1
    return count / (time.perf_counter() - started)


def training_thread_share(pickled: bytes, work: Callable[[], None]) -> dict[str, float]:
    """What the helper's parse takes from a training thread doing ``work``: its pace while the helper parses,
    against its pace alone, and the seconds of its work that the parse cost it."""
    alone = loop_rate(work, 1.0)
    done = threading.Event()
    took: list[float] = []

    def helper() -> None:
        started = time.perf_counter()
        parse(pickled)
        took.append(time.perf_counter() - started)
        done.set()

    thread = threading.Thread(target=helper)
    thread.start()
    during = loop_rate(work, 30.0, done)
    thread.join()
    return {"parse_wall_s": round(took[0], 3), "pace_during_parse": round(during / alone, 3),
            "stall_s": round(took[0] * (1 - during / alone), 3)}


def job_share(ranks: int, rate: float, cost_s: float, steps: int, seed: int) -> dict[str, float]:
    """The job's share of time in reads over ``steps`` steps: each rank's schedule driven read by read, the job
    stalled at each read step by its slowest reader; before, N unaligned stalls of the per-rank rule."""
    rng = random.Random(seed)
    ids_per_step = rate * STEP_S
    stalls: dict[int, float] = {}
    intervals, wrapped = set(), 0
    for _ in range(ranks):
        schedule = device_colls.ReadSchedule(ENTRIES)
        step, last = 0, 0
        while True:
            step = (step // schedule.interval + 1) * schedule.interval
            if step > steps:
                break
            wrapped += (step - last) * ids_per_step > ENTRIES
            held = min(step * ids_per_step, ENTRIES)
            cost = cost_s * held / ENTRIES * (1 + COST_SPREAD * rng.random())
            stalls[step] = max(stalls.get(step, 0.0), cost)
            schedule.measured(step, step * STEP_S, int(step * ids_per_step), cost)
            intervals.add(schedule.interval)
            last = step
    before_interval_s = max(device_colls.MIN_READ_INTERVAL_S, cost_s / device_colls.READ_BUDGET)
    return {"ranks": ranks, "collectives_per_s": rate, "after_pct": round(100 * sum(stalls.values()) / (steps * STEP_S), 3),
            "read_steps": len(stalls), "intervals": sorted(intervals)[-3:], "reads_past_a_full_ring": wrapped,
            "before_pct": round(100 * ranks * cost_s / before_interval_s, 1),
            "before_ring_wraps": before_interval_s * rate > ENTRIES}


def render(result: dict) -> str:
    m, r = result["machine"], result["read"]
    d = r["dumps"]
    lines = [
        "# Flight-recorder reads: what one costs a rank, what they cost a job of N ranks",
        "",
        f"{m['date']}, {m['cpu_count']} CPUs, load {m['load_average_1_5_15']} (a shared host), torch {m['torch']}; "
        f"`{m['command']}`.",
        "",
        "## One read of 20,000 entries",
        "",
        "| part | seconds (median) |",
        "| --- | ---: |",
        f"| C++ dump, pickled without stack traces ({d['pickled_mb']} MB; the generic recorder's, real gloo entries) "
        f"| **{d['pickled_dump_s']:.3f}** |",
        f"| its decoding (`pickle.loads`) | {d['unpickle_s']:.3f} |",
        f"| before: C++ dump as JSON ({d['json_mb']} MB) | {d['json_dump_s']:.3f} |",
        f"| before: its decoding (`json.loads`) | {d['json_loads_s']:.3f} |",
        f"| a rank's read in Python on a fake NCCL ring (decode, the 15,000 new entries by record id, `device_colls`, "
        f"gaps) | {r['read_s']:.3f} |",
        "",
        f"A read holds the training thread for about **{r['stall_s']:.2f} s** (the pickled dump and the read in "
        f"Python), where the JSON dump and its decoding alone took {d['json_dump_s'] + d['json_loads_s']:.2f} s. An "
        "NCCL recorder's dump adds two CUDA event queries per entry (not measurable here).",
        "",
        "Whether a helper thread would shorten it: a training thread's pace while a helper decodes and filters the "
        "same dump (they share the GIL):",
        "",
        "| training thread | its pace meanwhile | the helper's wall time | training thread's time lost |",
        "| --- | ---: | ---: | ---: |",
        f"| always in Python (a CPU loop) | {r['gil']['python']['pace_during_parse']:.0%} | "
        f"{r['gil']['python']['parse_wall_s']:.3f} s | {r['gil']['python']['stall_s']:.3f} s |",
        f"| a GPU job's: 0.1 ms of Python, then 0.3 ms waiting without the GIL | "
        f"{r['gil']['gpu_like']['pace_during_parse']:.0%} | {r['gil']['gpu_like']['parse_wall_s']:.3f} s | "
        f"{r['gil']['gpu_like']['stall_s']:.3f} s |",
        "",
        "It would not: both lose about what the helper spends. A thread always in Python shares the GIL with it; "
        "a GPU job's, which gives the GIL up at every wait, waits up to a switch interval (5 ms) to get it back each "
        "time. So the read stays on the training thread, made as short as torch allows.",
        "",
        "## The job's share of time in reads, by ranks",
        "",
        f"Steps of {STEP_S} s, {result['steps']:,} of them, a ring of 20,000; every read costs 1.00-1.25x "
        f"{r['stall_s']:.2f} s on its rank (drawn at random each read), less while the ring is not yet full. "
        "Before: each rank on its own clock, one read every max(5 s, cost / 0.5%), the job waiting for each rank's "
        "stall at its next collective (N stalls; past 100% they overlap: the job would be stalled nearly all the time). Now: the shared schedule, simulated read by read; the job pays "
        "the slowest reader's stall at each read step.",
        "",
        "| ranks | collectives / s | before: job time in reads | before: ring wraps between reads | "
        "now: job time in reads | now: read steps | now: last intervals (steps) | now: reads past a full ring |",
        "| ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |",
    ]
    lines += [f"| {j['ranks']:,} | {j['collectives_per_s']} | {j['before_pct']}% | "
              f"{'yes' if j['before_ring_wraps'] else 'no'} | **{j['after_pct']}%** | {j['read_steps']} | "
              f"{', '.join(map(str, j['intervals']))} | {j['reads_past_a_full_ring']} |" for j in result["jobs"]]
    lines += ["", "- Now the job's share does not grow with its ranks: wherever ranks pick different intervals, the "
              "longer one's steps are among the shorter one's, so readers stall together.",
              "- At 300 collectives a second the ring's margin (3/4 of 20,000 entries, 50 s) asks for a read every 256 "
              f"steps; a read of {r['stall_s']:.2f}-{r['stall_s'] * (1 + COST_SPREAD):.2f} s costs more than the "
              "0.5% budget then, so ranks read as often as the 1% ceiling allows (512 steps, or 1,024 where a read "
              f"costs more than {device_colls.READ_CEILING * 512 * STEP_S:.2f} s): those lose the entries the ring "
              "overwrote (the last column), counted in their records as `device_colls_lost`, whose steps the "
              "analysis holds as unknown.",
              "", "`python benchmarks/recorder_read.py`.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    dumps = real_dumps(args.reps)
    pickled = pickle.dumps({"version": "2.10", "entries": fake_nccl_entries()})
    read_s = a_read(pickled, args.reps)
    gil = {"python": training_thread_share(pickled, python_work),
           "gpu_like": training_thread_share(pickled, gpu_like_work)}
    stall_s = round(dumps["pickled_dump_s"] + read_s, 3)
    jobs = [job_share(n, rate, stall_s, args.steps, seed=n + rate) for rate in RATES for n in RANKS]
    result = {"machine": machine(), "steps": args.steps,
              "read": {"dumps": dumps, "read_s": round(read_s, 3), "gil": gil, "stall_s": stall_s}, "jobs": jobs}
    save("recorder_read", result, render(result))
    print(render(result))


if __name__ == "__main__":
    main()
