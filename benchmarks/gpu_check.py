"""What only a GPU can show: the device view of issues 49 and 61 checked against the profiler's own trace.

    python benchmarks/gpu_check.py --make-wheels benchmarks/gpu_wheels   # beforehand, where PyPI is reached
    python benchmarks/gpu_check.py --wheels benchmarks/gpu_wheels        # on the GPU machine, no network

On one GPU, in under 8 minutes (the jobs are gpu_check_job.py, a plain script):

1. A single-rank NCCL job under `diagtrain run` (steps 40-42 profiled): every step record carries
   the device fields; the device's step times of the profiled steps agree with the kernel trace of
   the same steps within 5%; per collective op, the device time the records hold against the GPU work
   that op launched (its kernels or copies on NCCL's stream, found by the op's annotation in the
   trace) within 5% for the asynchronous 1 GiB all-gather (a one-rank in-place all-reduce launches
   no GPU work: shown, not compared); no `torch.cuda.synchronize` while the loop ran (the job counts
   them) and none in the trace; NVML telemetry rows; the CUDA memory counters, the peak never reset
   (the job's own `max_memory_allocated` is the records' last peak); timed NCCL entries in the
   flight recorder's dump.
2. PyTorch's whole-network CUDA graph capture (forward, backward and `optimizer.step()` in one graph,
   replayed) under `diagtrain run`: the optimizer hooks fire inside the capture and the job still ends
   cleanly, its eager steps recorded.
3. Overhead: the same job alone and under `diagtrain run --profile-steps none`, interleaved,
   median step time after warm-up: at most 1% slower.
4. A CUDA out-of-memory provoked on purpose: the crash finding names rank 0, the allocation and the
   memory at the time.
5. Two ranks sharing the GPU over gloo, rank 1 slowed: the report names rank 1; each rank's steps
   are timed on its device, and its collectives (gloo's, which NCCL's timing does not see) leave its
   waits unknown, so the analysis weighs the steps on the hosts, never as waits of 0.
6. Real fixtures from these runs into tests/fixtures/gpu/ (a trace, an NCCL log, NVML samples, a
   flight-recorder dump), with their provenance.

Not shown on one GPU: the devices' waits for each other across ranks (NCCL refuses two ranks on one
device); check 5 exercises the cross-rank judgement instead, and tests/test_device_time.py the waits.

Results: benchmarks/results/gpu_check.md and .json, written after every check (a check that fails or a
run cut short still leaves what the others showed). Without a GPU it says so, names what it would check
and exits 0 at once, writing the results file as "not yet run on a GPU" unless it already holds a GPU's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from common import RESULTS, machine, save

HERE = Path(__file__).resolve().parent
JOB = HERE / "gpu_check_job.py"
FIXTURES = HERE.parent / "tests" / "fixtures" / "gpu"
NOT_RUN = "not yet run on a GPU"
PROFILED = (40, 42)  # past warm-up (allocator growth, NCCL's first collectives, cuBLAS autotuning)
TRAIN_STEPS = 120
AGREE = 0.05  # device fields against the kernel trace: the bound
COMPARED_OPS = ("gather",)  # ops whose GPU work one rank shows: an out-of-place all-gather copies 1 GiB
OVERHEAD_TARGET = 1.01  # the bound on step time under diagtrain
PAIRS, OVERHEAD_STEPS, WARMUP_STEPS = 3, 80, 10
RUN_LIMIT_S = 150  # one job
TOTAL_LIMIT_S = 450  # every check: with the install and the start-up, under 8 minutes
MIN_CHECK_S = 30  # a check that has less than this left is not started
NVML_SAMPLES_KEPT = 200  # lines of NVML samples kept as a fixture
GPU_EVENT_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
# What the GPU machine's image lacks of what `diagtrain run` and its analysis import (it has torch, pandas,
# pyarrow, rich, psutil, nvidia-ml-py, prometheus-client); carried as wheels with diagtrain's own.
CARRIED = ("msgspec", "isal")
TARGET = {"python": "3.12", "platforms": ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")}
SITE = Path(tempfile.gettempdir()) / "gpu_check_site"  # where --wheels installs, first on every job's PYTHONPATH
DEADLINE = {"at": float("inf")}  # time.monotonic() by which every job has ended (run_checks sets it)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_wheels:
        return make_wheels(Path(args.make_wheels))
    try:
        import torch
    except ImportError:
        return no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        return no_gpu("torch.cuda.is_available() is false")
    if args.wheels and os.environ.get("GPU_CHECK_INSTALLED") != str(SITE):
        return install_and_rerun(Path(args.wheels), argv)
    return run_checks(torch, time.monotonic() + TOTAL_LIMIT_S)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", metavar="DIR", help="install the wheels in DIR (made by --make-wheels) first")
    parser.add_argument("--make-wheels", metavar="DIR", help="write diagtrain's wheel and those of what the GPU "
                        "image lacks into DIR (on a machine that reaches PyPI), then stop")
    return parser.parse_args(argv)


def no_gpu(why: str) -> int:
    """Say so and what it would check, and record it unless the results file already holds what a GPU showed."""
    print(f"gpu_check: this check needs a CUDA GPU and there is none here ({why}); nothing was run.\n"
          f"On a GPU machine it checks, in under 8 minutes:\n{what_it_checks()}\n"
          "How to run it there: benchmarks/README.md, 'The GPU check'.")
    md = RESULTS / "gpu_check.md"
    if not md.exists() or NOT_RUN in md.read_text():
        save("gpu_check", {"status": NOT_RUN, "checks": []}, not_run_text())
    return 0


def what_it_checks() -> str:
    return __doc__.split("in under 8 minutes (the jobs are gpu_check_job.py, a plain script):\n", 1)[1] \
        .split("\nResults:", 1)[0].strip()


def not_run_text() -> str:
    return ("# GPU check\n\nStatus: " + NOT_RUN + ". No GPU has been lent to a session that could run "
            "`python benchmarks/gpu_check.py` yet (benchmarks/README.md, 'The GPU check', says how).\n\n"
            "What it will check, on one GPU in under 8 minutes:\n\n" + what_it_checks() + "\n")


# -- wheels: made where PyPI is reached, installed on the GPU machine ------------------------------------------


def make_wheels(folder: Path) -> int:
    """diagtrain's wheel and, for the GPU image's Python, those of the packages it lacks, at the versions here."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(folder), str(HERE.parent)], check=True)
    platforms = [arg for p in TARGET["platforms"] for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", TARGET["python"],
                    "--implementation", "cp", *platforms, "-d", str(folder),
                    *(f"{name}=={metadata.version(name)}" for name in CARRIED)], check=True)
    print(f"gpu_check: wheels in {folder}: {', '.join(sorted(p.name for p in folder.glob('*.whl')))}")
    return 0


def install_and_rerun(folder: Path, argv: list[str] | None) -> int:
    """Install the wheels of ``folder`` into SITE (no index, nothing fetched), then run the checks with SITE first
    on the path of this process and of every job it starts."""
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        print(f"gpu_check: no wheels in {folder}: make them with --make-wheels where PyPI is reached")
        return 2
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(SITE), *wheels], check=True)
    env = {**os.environ, "GPU_CHECK_INSTALLED": str(SITE),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])],
                          env=env, check=False).returncode


# -- the checks, each recorded as soon as it is done -----------------------------------------------------------


def run_checks(torch: Any, deadline: float) -> int:
    """Every check in turn, within ``deadline``; the results file rewritten after each one."""
    DEADLINE["at"] = deadline
    gpu = {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__}
    result = {"machine": machine(), "gpu": gpu, "seconds": 0, "status": "running", "checks": [],
              "not_shown": "device waits across ranks: NCCL refuses two ranks on one GPU (check 5 judges two gloo "
                           "ranks instead; tests/test_device_time.py covers the waits)"}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        for name, check in CHECKS:
            result["checks"] += run_one(name, check, Path(tmp) / name.replace(" ", "_"), deadline)
            result["seconds"] = round(time.monotonic() - started)
            save("gpu_check", result, render(result))
    failed = [c["check"] for c in result["checks"] if not c["ok"]]
    result["status"] = "failed" if failed else "ok"
    save("gpu_check", result, render(result))
    print(f"gpu_check: {len(result['checks']) - len(failed)}/{len(result['checks'])} checks passed in "
          f"{result['seconds']} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def run_one(name: str, check: Callable[[Path], list[dict]], tmp: Path, deadline: float) -> list[dict]:
    """One check's results; its failure, or no time left for it, is a result too."""
    left = deadline - time.monotonic()
    if left < MIN_CHECK_S:
        return [{"check": name, "ok": False, "detail": f"not run: {left:.0f} s left of the check's time"}]
    t0 = time.monotonic()
    try:
        found = check(tmp)
    except Exception as e:  # noqa: BLE001 - one check's failure is recorded; the others still run
        found = [{"check": name, "ok": False, "detail": f"{type(e).__name__}: {e}"[:2000]}]
    print(f"gpu_check: {name} done in {time.monotonic() - t0:.0f} s", flush=True)
    return found


# -- the jobs ----------------------------------------------------------------------------------------------------


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(JOB)]


def diagtrain_run(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *args, "--"]


def job(cmd: list[str], env: dict[str, str], expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Run one job; a job that should succeed and did not stops its check with its output."""
    limit = max(1.0, min(RUN_LIMIT_S, DEADLINE["at"] - time.monotonic()))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False,
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


# -- 1. the device view ------------------------------------------------------------------------------------------


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
    spans, by_op = step_spans(trace), op_times(trace)
    checks = [
        {"check": "device fields on every step", "ok": all(r.get("device_source") == "cuda_events" for r in steps)
         and len(device_steps) >= len(steps) - 1,
         "detail": f"{len(steps)} step records, device times of {len(device_steps)} steps, "
                   f"{len(extra)} end-of-run line(s), {len(colls)} collectives timed"},
        agreement("device step time vs kernel trace", {s: device_steps[s]["step_ms"] for s in spans if s in device_steps},
                  spans),
        *op_agreements(colls, by_op),
        {"check": "no synchronize per step", "ok": own["synchronize_calls"] == 0 and sync_calls(trace) == 0,
         "detail": f"torch.cuda.synchronize called {own['synchronize_calls']} times while the loop ran; "
                   f"{sync_calls(trace)} device/stream synchronizations in the profiled steps' trace"},
        nvml_rows(out),
        memory_counters(steps, own),
        flight_recorder_timed(out),
    ]
    keep_fixtures(out, trace_path)
    return checks


def step_spans(trace: list[dict]) -> dict[int, float]:
    """Per profiled step: the device's span (ms) of the work the host launched in it."""
    launched = {e["args"]["correlation"]: e["ts"] for e in trace
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    out = {}
    for step, start, end in _steps(trace):
        gpu = [e for e in trace if e.get("cat") in GPU_EVENT_CATS
               and start <= launched.get(e.get("args", {}).get("correlation"), -1) <= end]
        if gpu:
            out[step] = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3
    return out


def op_times(trace: list[dict]) -> dict[str, dict[int, float]]:
    """Per collective op (its ``nccl:`` annotation) and profiled step: the time (ms) of the GPU work launched inside
    the annotation, on whatever stream it ran (NCCL's, for an asynchronous op)."""
    gpu = {e["args"]["correlation"]: e["dur"] for e in trace
           if e.get("cat") in GPU_EVENT_CATS and "correlation" in e.get("args", {})}
    launches = [e for e in trace if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})]
    steps = _steps(trace)
    out: dict[str, dict[int, float]] = {}
    for op in (e for e in trace if e.get("ph") == "X" and str(e.get("name", "")).startswith("nccl:")):
        step = next((s for s, start, end in steps if start <= op["ts"] <= end), None)
        if step is None:
            continue
        inside = [gpu.get(e["args"]["correlation"], 0.0) for e in launches
                  if e.get("tid") == op.get("tid") and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]]
        per_step = out.setdefault(op["name"], {})
        per_step[step] = per_step.get(step, 0.0) + sum(inside) / 1e3
    return out


def _steps(trace: list[dict]) -> list[tuple[int, float, float]]:
    return [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in trace
            if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"]


def op_agreements(colls: list[dict], by_op: dict[str, dict[int, float]]) -> list[dict]:
    """Per op the trace shows: the records' device time against its own GPU work, compared where one rank has some."""
    found = []
    for op, trace_ms in sorted(by_op.items()):
        ours = {s: sum(c["ms"] for c in colls if c["op"] == op and c["step"] == s) for s in trace_ms}
        result = agreement(f"collective device time vs its own GPU work: {op}", ours, trace_ms)
        if not any(word in op for word in COMPARED_OPS):
            result = {**result, "ok": True, "detail": "shown, not compared (one rank's in-place op launches no GPU "
                                                      "work): " + result["detail"]}
        found.append(result)
    return found or [{"check": "collective device time vs its own GPU work", "ok": False,
                      "detail": "no nccl: annotation in the profiled steps"}]


def agreement(name: str, ours: dict[int, float], trace: dict[int, float]) -> dict:
    """Our totals over the profiled steps against the trace's, within AGREE."""
    common = sorted(set(ours) & set(trace))
    a, b = sum(ours[s] for s in common), sum(trace[s] for s in common)
    error = abs(a - b) / b if b else float("inf")
    return {"check": name, "ok": bool(common) and error <= AGREE,
            "detail": f"steps {common}: ours {a:.3f} ms, trace {b:.3f} ms ({error:.1%} apart; at most {AGREE:.0%})",
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


# -- 2. a CUDA graph captured around the optimizer step ----------------------------------------------------------


def check_graph_capture(tmp: Path) -> list[dict]:
    out, times = tmp / "run", tmp / "times"
    proc = job(diagtrain_run(out, "--profile-steps", "none", "--no-analyze") + [sys.executable, str(JOB)],
               {"MODE": "graph", "STEPS": "50", "STEP_TIMES_DIR": str(times)}, expect_ok=False)
    own = json.loads((times / "graph.json").read_text()) if (times / "graph.json").exists() else {}
    steps, _ = records(out) if (out / "ranks/0/steps.jsonl").exists() else ([], [])
    warned = [w["message"] for w in json.loads((out / "manifest.json").read_text()).get("warnings", [])] \
        if (out / "manifest.json").exists() else []
    ok = proc.returncode == 0 and own.get("replays") == 50 and len(steps) == own.get("optimizer_steps")
    return [{"check": "a CUDA graph captured around optimizer.step(): the job ends cleanly", "ok": ok,
             "detail": f"exit {proc.returncode}; {own.get('replays')} replays; {len(steps)} step records for "
                       f"{own.get('optimizer_steps')} optimizer steps (warm-up and the captured one); diagtrain's "
                       f"warnings: {warned or 'none'}" + ("" if proc.returncode == 0 else f"; {proc.stderr[-800:]}")}]


# -- 3. overhead -------------------------------------------------------------------------------------------------


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


# -- 4. out of memory --------------------------------------------------------------------------------------------


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


# -- 5. two ranks over gloo, one slowed ----------------------------------------------------------------------------


def check_gloo_straggler(tmp: Path) -> list[dict]:
    import pandas as pd

    out = tmp / "run"
    job(diagtrain_run(out, "--profile-steps", "none") + torchrun(2),
        {"MODE": "gloo_slow", "STEPS": "60", "DIM": "512", "LAYERS": "2"})
    found = [f for f in report(out)["findings"] if f["kind"] == "straggler"]
    ledger = pd.read_parquet(out / "analysis" / "ledger.parquet")
    timed = {r: sum(1 for s in records(out, r)[0] if s.get("device_source") == "cuda_events") for r in (0, 1)}
    sources = sorted(set(ledger["time_source"])) if "time_source" in ledger else []
    return [{"check": "two ranks sharing the GPU over gloo: the slowed rank is named", "ok": any(
                f["ranks"] == [1] for f in found), "detail": "; ".join(f"{f['ranks']}: {f['explanation'][:300]}"
                                                                    for f in found) or "no straggler finding"},
            {"check": "gloo's collectives untimed on the device: waits unknown, steps weighed on the hosts",
             "ok": min(timed.values()) > 0 and sources == ["host"],
             "detail": f"steps timed on each rank's device: {timed}; the ledger's time_source: {sources}"}]


CHECKS = (("device view", check_device_view), ("graph capture", check_graph_capture), ("overhead", check_overhead),
          ("out of memory", check_oom), ("gloo straggler", check_gloo_straggler))


# -- fixtures and results ------------------------------------------------------------------------------------------


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
        f"The job: benchmarks/gpu_check_job.py (MODE=train, {TRAIN_STEPS} steps, DDP over NCCL on one rank and an "
        f"asynchronous 1 GiB all-gather a step, `TORCH_NCCL_ENABLE_TIMING=1` as `diagtrain run` sets it), under "
        f"`diagtrain run --profile-steps {PROFILED[0]}-{PROFILED[1]} -- torchrun --standalone --nproc-per-node=1`.\n\n"
        "- `trace-rank0.json.gz`: rank 0's profiler trace of the profiled steps\n"
        "- `nccl.log`: rank 0's `NCCL_DEBUG=INFO` log\n"
        f"- `nvml_samples.jsonl`: the first {NVML_SAMPLES_KEPT} NVML samples of the wrapper's telemetry.jsonl\n"
        "- `flight_recorder.json`: rank 0's flight-recorder dump at exit (entries with `duration_ms`)\n")


def render(result: dict) -> str:
    gpu, when = result["gpu"], result["machine"]
    lines = ["# GPU check", "", (f"{gpu['name']}, CUDA {gpu['cuda']}, NCCL {gpu['nccl']}, torch {gpu['torch']}, "
                                 f"{when['date']}, {result['seconds']} s; status: {result['status']}."), "",
             "| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'} | {c['detail'].replace('|', '/')} |"
              for c in result["checks"]]
    return "\n".join(lines) + (f"\n\nNot shown on one GPU: {result['not_shown']}.\n\n"
                               "`python benchmarks/gpu_check.py --wheels benchmarks/gpu_wheels`; fixtures in "
                               "tests/fixtures/gpu/.\n")


if __name__ == "__main__":
    sys.exit(main())
