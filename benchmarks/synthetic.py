"""Synthetic Kineto traces of any size, shaped like a GPU training step: CPU ops launching
kernels (correlated), NCCL kernels on a second stream, ProfilerStep annotations, distributedInfo.
Used by the speed and scale benchmarks; written with plain string formatting to be fast."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

EVENTS_PER_LAUNCH = 3  # a cpu_op, its cudaLaunchKernel and the kernel
COMM_EVERY = 20  # one kernel in this many is an all-reduce, unless a number per step is asked for
# Correlation ids as a process that has run a while numbers them. HTA 0.5.0 on pandas 3 cannot load a
# trace of more than 32,767 events whose ids all fit int16 (its index_correlation column is int16).
FIRST_CORRELATION = 1 << 16


def write_trace(path: Path, rank: int, world: int, events: int, steps: int = 5, seed: int = 0,
                collectives_per_step: int | None = None) -> Path:
    """A gzipped trace with about ``events`` duration events for ``rank`` of ``world``; one all-reduce in
    COMM_EVERY kernels, or ``collectives_per_step`` of them spread evenly over each step."""
    rng = random.Random(seed + rank)
    launches = max(events // EVENTS_PER_LAUNCH, steps)
    per_step = launches // steps
    if collectives_per_step is None:
        is_comm = [i % COMM_EVERY == COMM_EVERY - 1 for i in range(per_step)]
    else:
        is_comm = [(i + 1) * collectives_per_step // per_step > i * collectives_per_step // per_step
                   for i in range(per_step)]
    info = {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world,
                           "ranks": list(range(world))}]}
    header = f'{{"schemaVersion":1,"distributedInfo":{json.dumps(info)},"baseTimeNanoseconds":1790000000000000000,"traceEvents":['
    ts, corr = 1_000.0, FIRST_CORRELATION
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(header)
        for step in range(steps):  # written a step at a time: a trace of gigabytes never sits in memory
            lines, step_start = [], ts
            for i in range(per_step):
                dur = rng.uniform(5, 50)
                comm = is_comm[i]
                name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if comm else f"void gemm_kernel_{i % 7}"
                lines.append(f'{{"ph":"X","cat":"cpu_op","name":"aten::op{i % 11}","pid":1,"tid":1,"ts":{ts:.3f},"dur":{dur:.3f},"args":{{"External id":{corr}}}}}')
                lines.append(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{ts + 1:.3f},"dur":2.0,"args":{{"correlation":{corr}}}}}')
                stream = 20 if comm else 7
                args = (f'"stream":{stream},"correlation":{corr},"Collective name":"allreduce","In msg nelems":1048576,'
                        f'"Group size":{world},"dtype":"Float","Process Group Name":"0","Process Group Description":"default_pg"'
                        if comm else f'"stream":{stream},"correlation":{corr}')
                lines.append(f'{{"ph":"X","cat":"kernel","name":"{name}","pid":0,"tid":{stream},"ts":{ts + 5:.3f},"dur":{dur * 0.8:.3f},"args":{{{args}}}}}')
                ts += dur + rng.uniform(0, 5)
                corr += 1
            lines.append(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step + 1}","pid":1,"tid":1,"ts":{step_start:.3f},"dur":{ts - step_start:.3f}}}')
            f.write((",\n" if step else "") + ",\n".join(lines))
        f.write("]}")
    return path


def unpacked_mib(trace: Path) -> float:
    """Size of a gzipped trace's JSON once unpacked (what a parser holds at least once), in MiB."""
    size = 0
    with gzip.open(trace, "rb") as f:
        while chunk := f.read(8 << 20):
            size += len(chunk)
    return size / 2**20


def trace_set(folder: Path, world: int, events: int, collectives_per_step: int | None = None) -> Path:
    """``world`` synthetic ranks in ``folder`` (rank<r>.json.gz)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        write_trace(folder / f"rank{rank}.json.gz", rank, world, events, collectives_per_step=collectives_per_step)
    return folder


def relabeled_copies(source: Path, folder: Path, world: int) -> Path:
    """``world`` copies of one real trace, relabeled as ranks 0..world-1 (distributedInfo.rank)."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(source, "rt") as f:
        trace = json.load(f)
    for rank in range(world):
        info = dict(trace.get("distributedInfo") or {}, rank=rank, world_size=world)
        with gzip.open(folder / f"rank{rank}.json.gz", "wt", compresslevel=1) as f:
            json.dump({**trace, "distributedInfo": info}, f)
    return folder


def copy_run_traces(run: Path, folder: Path) -> Path:
    """The traces of a diagtrain run directory, flattened into one folder (HTA's layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in run.glob("ranks/*/trace-*.json.gz"):
        shutil.copy(path, folder / path.name)
    return folder
