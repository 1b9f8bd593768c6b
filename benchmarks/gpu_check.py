"""What only a GPU can show: the device view of issue 49 checked against the profiler's own trace.

    python benchmarks/gpu_check.py

On one GPU, in at most 10 minutes (the job is gpu_check_job.py, a plain script under torchrun):

1. A single-rank NCCL job under `diagtrain run` (steps 40-42 profiled): every step record carries
   the device fields; the device's step times and collective times of the profiled steps agree with
   the kernel trace of the same steps within 5%; no `torch.cuda.synchronize` while the loop ran
   (the job counts them) and none in the trace; NVML telemetry rows; the CUDA memory counters, the
   peak never reset (the job's own `max_memory_allocated` is the records' last peak).
2. Overhead: the same job alone and under `diagtrain run --profile-steps none`, interleaved,
   median step time after warm-up: at most 1% slower.
3. A CUDA out-of-memory provoked on purpose: the crash finding names rank 0, the allocation and the
   memory at the time.
4. Two ranks sharing the GPU over gloo, rank 1 slowed: the report names rank 1.
5. Real fixtures from these runs into tests/fixtures/gpu/ (a trace, an NCCL log, NVML samples, a
   flight-recorder dump), with their provenance.

Results: benchmarks/results/gpu_check.md and .json. Without a GPU it says so and exits 0 at once,
writing the results file as "not yet run on a GPU" unless it already holds a GPU's results.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, machine, save

JOB = Path(__file__).resolve().parent / "gpu_check_job.py"
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu"
NOT_RUN = "not yet run on a GPU"
PROFILED = (40, 42)  # past warm-up (allocator growth, NCCL's first collectives, cuBLAS autotuning)
TRAIN_STEPS = 120
AGREE = 0.05  # device fields against the kernel trace: the bound
OVERHEAD_TARGET = 1.01  # the bound on step time under diagtrain
PAIRS, OVERHEAD_STEPS, WARMUP_STEPS = 3, 80, 10
RUN_LIMIT_S = 150  # one job; the whole check stays within 10 minutes
NVML_SAMPLES_KEPT = 200  # lines of NVML samples kept as a fixture
GPU_EVENT_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def main() -> int:
    try:
        import torch
    except ImportError:
        return no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        return no_gpu("torch.cuda.is_available() is false")
    started = time.monotonic()
    checks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        tmp = Path(tmp)
        for name, check in (("device view", check_device_view), ("overhead", check_overhead),
                            ("out of memory", check_oom), ("gloo straggler", check_gloo_straggler)):
            t0 = time.monotonic()
            try:
                checks += check(tmp / name.replace(" ", "_"))
            except Exception as e:  # noqa: BLE001 - one check's failure is recorded; the others still run
                checks.append({"check": name, "ok": False, "detail": f"{type(e).__name__}: {e}"})
            print(f"gpu_check: {name} done in {time.monotonic() - t0:.0f} s", flush=True)
    gpu = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
           "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    result = {"machine": machine(), "gpu": gpu, "seconds": round(time.monotonic() - started), "checks": checks}
    save("gpu_check", result, render(result))
    failed = [c["check"] for c in checks if not c["ok"]]
    print(f"gpu_check: {len(checks) - len(failed)}/{len(checks)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def no_gpu(why: str) -> int:
    """Say so, and record it unless the results file already holds what a GPU showed."""
    print(f"gpu_check: no GPU here ({why}); nothing to check. Run it on a machine with one CUDA GPU.")
    md = RESULTS / "gpu_check.md"
    if not md.exists() or NOT_RUN in md.read_text():
        save("gpu_check", {"status": NOT_RUN, "checks": []}, not_run_text())
    return 0


def not_run_text() -> str:
    return ("# GPU check\n\nStatus: " + NOT_RUN + ". No GPU has been lent to a session that could run "
            "`python benchmarks/gpu_check.py` yet.\n\nWhat it will check, on one GPU in at most 10 minutes:\n"
            + __doc__.split("On one GPU, in at most 10 minutes (the job is gpu_check_job.py, a plain script "
                            "under torchrun):\n", 1)[1].split("\nResults:", 1)[0])


# -- the jobs ------------------------------------------------------------------------------------


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(JOB)]


def diagtrain_run(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *args, "--"]


def job(cmd: list[str], env: dict[str, str], expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Run one job; a job that should succeed and did not stops its check with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "4", **env})
    if expect_ok and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-3:])} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return proc


def records(run_dir: Path, rank: int = 0) -> tuple[list[dict], list[dict]]:
    """A rank's step records, and its lines that are not steps (the device line at the end)."""
    lines = [json.loads(x) for x in (run_dir / f"ranks/{rank}/steps.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in lines if "step" in r], [r for r in lines if "step" not in r]


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


# -- 1. the device view --------------------------------------------------------------------------


def check_device_view(tmp: Path) -> list[dict]:
    out, times = tmp / "run", tmp / "times"
    job(diagtrain_run(out, "--profile-steps", f"{PROFILED[0]}-{PROFILED[1]}") + torchrun(1),
        {"MODE": "train", "STEPS": str(TRAIN_STEPS), "STEP_TIMES_DIR": str(times)})
    steps, extra = records(out)
    own = json.loads((times / "rank0.json").read_text())
    device_steps = {d["step"]: d for r in steps + extra for d in r.get("device_steps", [])}
    colls = [c for r in steps + extra for c in r.get("device_colls", [])]
    trace_path = next(out.glob("ranks/0/trace-rank0-*.json.gz"))
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)["traceEvents"]
    by_trace = trace_times(trace)
    checks = [
        {"check": "device fields on every step", "ok": all(r.get("device_source") == "cuda_events" for r in steps)
         and len(device_steps) >= len(steps) - 1,
         "detail": f"{len(steps)} step records, device times of {len(device_steps)} steps, "
                   f"{len(extra)} end-of-run line(s), {len(colls)} collectives timed"},
        agreement("device step time vs kernel trace",
                  {s: device_steps[s]["step_ms"] for s in by_trace if s in device_steps},
                  {s: t["span_ms"] for s, t in by_trace.items()}),
        agreement("collective device time vs NCCL kernels in the trace",
                  {s: sum(c["ms"] for c in colls if c["step"] == s) for s in by_trace},
                  {s: t["nccl_ms"] for s, t in by_trace.items()}),
        {"check": "no synchronize per step", "ok": own["synchronize_calls"] == 0 and sync_calls(trace) == 0,
         "detail": f"torch.cuda.synchronize called {own['synchronize_calls']} times while the loop ran; "
                   f"{sync_calls(trace)} device/stream synchronizations in the profiled steps' trace"},
        nvml_rows(out),
        memory_counters(steps, own),
        flight_recorder_timed(out),
    ]
    keep_fixtures(out, trace_path)
    return checks


def trace_times(trace: list[dict]) -> dict[int, dict[str, float]]:
    """Per profiled step: the device's span of the work the host launched in it, and the time of its work on
    NCCL's streams (every stream but the one the most device time ran on: one-rank NCCL may copy, not launch)."""
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in trace
             if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"]
    launched = {e["args"]["correlation"]: e["ts"] for e in trace
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    out: dict[int, dict[str, float]] = {}
    for step, start, end in steps:
        gpu = [e for e in trace if e.get("cat") in GPU_EVENT_CATS
               and start <= launched.get(e.get("args", {}).get("correlation"), -1) <= end]
        if gpu:
            out[step] = {"span_ms": (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3,
                         "nccl_ms": sum(e["dur"] for e in gpu if _stream(e) != _busiest(gpu)) / 1e3}
    return out


def _stream(event: dict) -> Any:
    return event.get("args", {}).get("stream", event.get("tid"))


def _busiest(events: list[dict]) -> Any:
    busy: dict[Any, float] = {}
    for e in events:
        busy[_stream(e)] = busy.get(_stream(e), 0.0) + e["dur"]
    return max(busy, key=busy.get)


def agreement(name: str, ours: dict[int, float], trace: dict[int, float]) -> dict:
    """Our totals over the profiled steps against the trace's, within AGREE."""
    common = sorted(set(ours) & set(trace))
    a, b = sum(ours[s] for s in common), sum(trace[s] for s in common)
    error = abs(a - b) / b if b else float("inf")
    return {"check": name, "ok": bool(common) and error <= AGREE,
            "detail": f"steps {common}: ours {a:.2f} ms, trace {b:.2f} ms ({error:.1%} apart; at most {AGREE:.0%})",
            "per_step": {s: [round(ours[s], 3), round(trace[s], 3)] for s in common}}


def sync_calls(trace: list[dict]) -> int:
    return sum(1 for e in trace if e.get("cat") in LAUNCH_CATS
               and e.get("name") in ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cuCtxSynchronize"))


def nvml_rows(run_dir: Path) -> dict:
    import pandas as pd

    path = run_dir / "telemetry.parquet"
    gpu = pd.read_parquet(path).query("kind == 'gpu'") if path.exists() else pd.DataFrame()
    return {"check": "NVML telemetry rows", "ok": len(gpu) > 0,
            "detail": f"{len(gpu)} GPU samples; columns {sorted(c for c in gpu.columns if gpu[c].notna().any())}"}


def memory_counters(steps: list[dict], own: dict) -> dict:
    peaks = [r.get("gpu_peak_bytes") for r in steps]
    ok = (all(r.get("gpu_allocated_bytes") for r in steps) and all(p is not None for p in peaks)
          and peaks == sorted(peaks) and {r.get("mem_source") for r in steps} == {"cuda_lifetime_peak"}
          and own["max_memory_allocated"] >= peaks[-1])
    return {"check": "CUDA memory counters, peak never reset", "ok": ok,
            "detail": f"allocated {steps[-1].get('gpu_allocated_bytes')} B at the end, peak {peaks[-1]} B in the "
                      f"last record (never falling: {peaks == sorted(peaks)}); the job's own max_memory_allocated "
                      f"{own['max_memory_allocated']} B"}


def flight_recorder_timed(run_dir: Path) -> dict:
    path = run_dir / "ranks/0/flight_recorder.json"
    entries = json.loads(path.read_text()).get("entries", []) if path.exists() else []
    timed = [e for e in entries if e.get("duration_ms") is not None and str(e.get("profiling_name", "")).startswith("nccl")]
    return {"check": "flight_recorder.json holds timed NCCL entries", "ok": bool(timed),
            "detail": f"{len(entries)} entries, {len(timed)} NCCL ones with duration_ms"}


# -- 2. overhead ---------------------------------------------------------------------------------


def check_overhead(tmp: Path) -> list[dict]:
    alone, wrapped = [], []
    for pair in range(PAIRS):  # interleaved: a drift of the machine hits both arms alike
        env = {"MODE": "train", "STEPS": str(OVERHEAD_STEPS)}
        job(torchrun(1), {**env, "STEP_TIMES_DIR": str(tmp / f"alone{pair}")})
        alone.append(median_step_ms(tmp / f"alone{pair}"))
        job(diagtrain_run(tmp / f"run{pair}", "--profile-steps", "none", "--no-analyze") + torchrun(1),
            {**env, "STEP_TIMES_DIR": str(tmp / f"wrapped{pair}")})
        wrapped.append(median_step_ms(tmp / f"wrapped{pair}"))
    ratio = statistics.median(wrapped) / statistics.median(alone)
    return [{"check": "overhead against a bare run", "ok": ratio <= OVERHEAD_TARGET,
             "detail": f"median step {statistics.median(alone):.2f} ms alone, {statistics.median(wrapped):.2f} ms "
                       f"under diagtrain run (x{ratio:.4f}; at most x{OVERHEAD_TARGET}); pairs {alone} / {wrapped}"}]


def median_step_ms(times_dir: Path) -> float:
    return round(statistics.median(json.loads((times_dir / "rank0.json").read_text())["step_ms"][WARMUP_STEPS:]), 3)


# -- 3. out of memory ----------------------------------------------------------------------------


def check_oom(tmp: Path) -> list[dict]:
    out = tmp / "run"
    proc = job(diagtrain_run(out, "--profile-steps", "none") + torchrun(1), {"MODE": "oom", "STEPS": "20"},
               expect_ok=False)
    crash = [f for f in report(out)["findings"] if f["kind"] == "crash"]
    text = crash[0]["explanation"] if crash else ""
    ok = (proc.returncode != 0 and bool(crash) and crash[0]["ranks"] == [0] and "out of memory" in text.lower()
          and "Tried to allocate" in text and ("total capacity" in text or "allocated" in text))
    return [{"check": "a CUDA out-of-memory is a crash finding naming the rank, allocation and memory", "ok": ok,
             "detail": f"exit {proc.returncode}; " + (f"crash finding on ranks {crash[0]['ranks']}: {text[:600]}"
                                                       if crash else "no crash finding")}]


# -- 4. two ranks over gloo, one slowed ----------------------------------------------------------


def check_gloo_straggler(tmp: Path) -> list[dict]:
    out = tmp / "run"
    job(diagtrain_run(out, "--profile-steps", "none") + torchrun(2),
        {"MODE": "gloo_slow", "STEPS": "60", "DIM": "512", "LAYERS": "2"})
    found = [f for f in report(out)["findings"] if f["kind"] == "straggler"]
    return [{"check": "two ranks sharing the GPU over gloo: the slowed rank is named", "ok": any(
        f["ranks"] == [1] for f in found), "detail": "; ".join(f"{f['ranks']}: {f['explanation'][:300]}"
                                                            for f in found) or "no straggler finding"}]


# -- fixtures and results ------------------------------------------------------------------------


def keep_fixtures(run_dir: Path, trace: Path) -> None:
    """A trace, the NCCL log, NVML samples and the flight-recorder dump of the device-view run, with provenance."""
    import torch

    FIXTURES.mkdir(parents=True, exist_ok=True)
    shutil.copy(trace, FIXTURES / "trace-rank0.json.gz")
    for name in ("nccl.log", "flight_recorder.json"):
        if (run_dir / "ranks/0" / name).exists():
            shutil.copy(run_dir / "ranks/0" / name, FIXTURES / name)
    samples = [line for path in sorted(run_dir.glob("hosts/*/telemetry.jsonl")) for line in path.read_text().splitlines()
               if '"kind": "gpu"' in line or '"kind":"gpu"' in line]
    (FIXTURES / "nvml_samples.jsonl").write_text("".join(line + "\n" for line in samples[:NVML_SAMPLES_KEPT]))
    (FIXTURES / "PROVENANCE.md").write_text(
        f"# tests/fixtures/gpu\n\nRecorded by `python benchmarks/gpu_check.py` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}.\n\n"
        f"The job: benchmarks/gpu_check_job.py (MODE=train, {TRAIN_STEPS} steps, DDP over NCCL on one rank, "
        f"`TORCH_NCCL_ENABLE_TIMING=1` as `diagtrain run` sets it), under "
        f"`diagtrain run --profile-steps {PROFILED[0]}-{PROFILED[1]} -- torchrun --standalone --nproc-per-node=1`.\n\n"
        "- `trace-rank0.json.gz`: rank 0's profiler trace of the profiled steps\n"
        "- `nccl.log`: rank 0's `NCCL_DEBUG=INFO` log\n"
        f"- `nvml_samples.jsonl`: the first {NVML_SAMPLES_KEPT} NVML samples of the wrapper's telemetry.jsonl\n"
        "- `flight_recorder.json`: rank 0's flight-recorder dump at exit (entries with `duration_ms`)\n")


def render(result: dict) -> str:
    gpu, when = result["gpu"], result["machine"]
    lines = ["# GPU check", "", (f"{gpu['name']}, CUDA {gpu['cuda']}, NCCL {gpu['nccl']}, torch {when['torch']}, "
                                 f"{when['date']}, {result['seconds']} s."), "",
             "| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'} | {c['detail'].replace('|', '/')} |"
              for c in result["checks"]]
    return "\n".join(lines) + "\n\n`python benchmarks/gpu_check.py`; fixtures in tests/fixtures/gpu/.\n"


if __name__ == "__main__":
    sys.exit(main())
