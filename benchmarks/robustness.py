"""Robustness, counted: bad inputs given to the analysis and faults injected into real runs.

    python benchmarks/robustness.py [--repeats 3] [--fuzz-examples 1000]

1. Bad inputs: one real run (2 ranks under torchrun, steps 2-3 profiled, plus the files a hang and a
   reference trainer add). Every file of it, one at a time, under every mutation of the test corpus
   (truncated, emptied, another type, binary garbage, a directory, a FIFO, a dangling symlink, a
   symlink loop, a symlink to a device, unreadable, huge), and the issue's own cases, analyzed
   in-process. Counted: crashes (an exception out of the analysis or its report), unnamed (a data
   file made unusable but not listed under ``skipped``), damage (the untouched rank not analyzed in
   full, or a detector failing).
2. Fuzzing: tests/test_fuzz_readers.py with ``--fuzz-examples`` examples per reader (random, not the
   suite's fixed ones).
3. Faults, each ``--repeats`` times on a real 2-rank job: a full disk while profiling (RLIMIT_FSIZE;
   and a small tmpfs where this machine lets us mount one), SIGKILL of a rank, Ctrl-C at start-up,
   in training, while profiling and during the analysis, SIGTERM in training. Counted: crashes (a
   traceback through diagtrain's code, or a wrong exit code), runs that lost collected data (a step
   record missing that the heartbeat announced, a manifest not final, a file the analysis cannot
   read), orphan processes, temp files left.

Targets: 0 of every count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import machine, save

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import test_bad_inputs as corpus  # noqa: E402 - the suite's corpus, run here in full
import test_job_faults as faults  # noqa: E402
from conftest import USER_SCRIPT, processes_with, torchrun  # noqa: E402

from diagtrain.profiler.analyzer.report import document as report  # noqa: E402
from diagtrain.profiler.analyzer.analyze import analyze  # noqa: E402

INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM
TMPFS_BYTES = 420 << 10  # the reserve (256 KiB) and the run's small records fit; a profiled trace does not


def bad_inputs(root: Path) -> dict:
    """Every file x every mutation, and the issue's cases: counts of cases and of failures."""
    out = root / "source"
    faults.finish(faults.wrapper(out, "--profile-steps", "2-3", "--no-analyze", "--", *torchrun(2), str(USER_SCRIPT),
                                 marker=uuid.uuid4().hex, env={"STEPS": "6"}))
    base = corpus.make_base(out, root / "corpus")
    keep = root / "keep"
    counts = {"cases": 0, "crashes": 0, "unnamed": 0, "damaged": 0}
    failures = []
    names = corpus.DATA_FILES + corpus.LOGS + corpus.NOT_READ
    for name in names:
        for mutation in corpus.MUTATIONS:
            keep.mkdir(exist_ok=True)
            counts["cases"] += 1
            try:
                doc, [path] = corpus.analyze_with(base, keep, [name], mutation)
                report.markdown(doc).encode("utf-8")
            except Exception as e:  # noqa: BLE001 - counting them is the point
                counts["crashes"] += 1
                failures.append(f"{name} {mutation}: {type(e).__name__}: {e}")
                continue
            finally:
                shutil.rmtree(keep, ignore_errors=True)
            try:
                corpus.check(doc)
            except AssertionError as e:
                counts["damaged"] += 1
                failures.append(f"{name} {mutation}: {e}")
            unusable = name in corpus.DATA_FILES + corpus.LOGS and (name, mutation) not in corpus.HARMLESS
            if mutation == "unreadable":
                unusable = unusable and os.geteuid() != 0  # root reads a file of mode 000
            if unusable and not corpus.skipped_reason(doc, path):
                counts["unnamed"] += 1
                failures.append(f"{name} {mutation}: not listed under skipped")
    for case, make in corpus.SPECIAL.items():
        saved = root / "saved"
        shutil.copytree(base, saved, symlinks=True)
        counts["cases"] += 1
        try:
            path = make(base)
            doc = analyze(base, base, ["md", "json"], workers=1)
            corpus.check(doc)
            if case in corpus.MUST_SKIP and not corpus.skipped_reason(doc, path):
                counts["unnamed"] += 1
                failures.append(f"{case}: not listed under skipped")
        except AssertionError as e:
            counts["damaged"] += 1
            failures.append(f"{case}: {e}")
        except Exception as e:  # noqa: BLE001
            counts["crashes"] += 1
            failures.append(f"{case}: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(base)
            shutil.move(saved, base)
    return {**counts, "files": len(names), "mutations": len(corpus.MUTATIONS), "special": len(corpus.SPECIAL),
            "failures": failures}


def fuzzing(examples: int) -> dict:
    """The suite's fuzz tests with many more (random) examples."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_fuzz_readers.py")],
                          capture_output=True, text=True, env={**os.environ, "DIAGTRAIN_FUZZ_EXAMPLES": str(examples)})
    tests = [line for line in proc.stdout.splitlines() if " passed" in line or " failed" in line]
    return {"examples_per_test": examples, "result": tests[-1] if tests else proc.stdout[-500:],
            "failed": proc.returncode != 0, "seconds": round(time.monotonic() - start)}


# -- faults ------------------------------------------------------------------------------------


def _heartbeat_step(out: Path, rank: int) -> int:
    try:
        return json.loads((out / f"ranks/{rank}/heartbeat").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def _lost(out: Path, analysis: Path) -> list[str]:
    """What a finished run lacks of what it collected (analyzed into ``analysis``: its disk may be full)."""
    problems = []
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
    if manifest.get("status") in (None, "running") or not manifest.get("ended_at"):
        problems.append(f"manifest not final: {manifest.get('status')}")
    for folder in sorted(out.glob("ranks/*")):
        rank = int(folder.name)
        try:
            lines = (folder / "steps.jsonl").read_text().splitlines()
        except OSError:
            lines = []
        steps = set()
        for line in lines:
            try:
                steps.add(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                pass  # the line a kill cut: its step is not announced by the heartbeat either
        announced = _heartbeat_step(out, rank)
        if announced and not set(range(1, announced + 1)) <= steps:
            problems.append(f"rank {rank}: steps up to {announced} announced, {len(steps)} recorded")
    doc = analyze(out, analysis, ["json"], workers=1)
    problems += [f"unreadable: {s['path']}: {s['reason']}" for s in doc["skipped"]]
    return problems


CRASH_LINES = 12  # enough of a traceback to name the frame that raised


def _one_fault(kind: str, root: Path) -> dict:
    out, marker = root / "run", uuid.uuid4().hex
    job = ["--", *torchrun(2), str(USER_SCRIPT)]
    long_job = {"STEPS": "100000", "STEP_SLEEP": "0.05"}
    expected = {"disk full (RLIMIT_FSIZE)": 0, "disk full (tmpfs)": 0, "SIGKILL of a rank": None,
                "Ctrl-C at start-up": INTERRUPTED, "Ctrl-C in training": INTERRUPTED,
                "Ctrl-C while profiling": INTERRUPTED, "Ctrl-C during the analysis": INTERRUPTED,
                "SIGTERM in training": TERMINATED}[kind]
    mounted = None
    if kind == "disk full (tmpfs)":
        mounted = root / "tmpfs"
        mounted.mkdir(parents=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mounted)],
                          capture_output=True).returncode != 0:
            return {"kind": kind, "skipped": "this machine does not let us mount a tmpfs"}
        out = mounted / "run"
    try:
        if kind.startswith("disk full"):
            proc = faults.wrapper(out, "--profile-steps", "2-3", "--no-analyze", *job, marker=marker,
                                  env={"STEPS": "6"}, limit_files=kind.endswith("(RLIMIT_FSIZE)"))
            stderr = faults.finish(proc)
        elif kind == "SIGKILL of a rank":
            proc = faults.wrapper(out, "--no-analyze", *job, marker=marker, env=long_job)
            faults.wait_for(lambda: faults.step_reached(out, 1, 3), "rank 1 at step 3")
            os.kill(json.loads((out / "ranks/1/rank.json").read_text())["pid"], signal.SIGKILL)
            stderr = faults.finish(proc)
        elif kind == "Ctrl-C during the analysis":
            proc = faults.wrapper(out, "--profile-steps", "2-3", *job, marker=marker, env={"STEPS": "4"})
            stderr = faults.interrupt(out, proc, lambda: (out / "analysis").is_dir())
        else:
            profile = ["--profile-steps", "2-1000"] if kind == "Ctrl-C while profiling" else []
            proc = faults.wrapper(out, *profile, "--no-analyze", *job, marker=marker, env=long_job)
            when = (lambda: any(out.glob("hosts/*/host.json"))) if kind == "Ctrl-C at start-up" else \
                (lambda: faults.step_reached(out, 0, 4) and faults.step_reached(out, 1, 4))
            stderr = faults.interrupt(out, proc, when) if "Ctrl-C" in kind else None
            if stderr is None:  # SIGTERM
                faults.wait_for(when, "step 4")
                proc.send_signal(signal.SIGTERM)
                stderr = faults.finish(proc)
        time.sleep(1.0)  # what a stopped job leaves would have exited by now
        crashed = bool(faults.raised_in_our_code(stderr or "")) or (expected is not None and proc.returncode != expected) \
            or (expected is None and proc.returncode in (0, None))
        return {"kind": kind, "exit_code": proc.returncode, "crashed": crashed, "lost": _lost(out, root / "analysis"),
                "orphans": len(processes_with(marker)), "temp_files": faults.leftovers(out),
                "stderr_tail": _tail(stderr) if crashed else ""}
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], capture_output=True)


def _tail(stderr: str | None, lines: int = CRASH_LINES) -> str:
    """What the record shows of a crash: the exceptions our code raised, else the end of stderr."""
    return "\n".join(faults.raised_in_our_code(stderr or "") or (stderr or "").splitlines()[-lines:])


FAULTS = ["disk full (RLIMIT_FSIZE)", "disk full (tmpfs)", "SIGKILL of a rank", "Ctrl-C at start-up",
          "Ctrl-C in training", "Ctrl-C while profiling", "Ctrl-C during the analysis", "SIGTERM in training"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each fault (default 3)")
    parser.add_argument("--fuzz-examples", type=int, default=1000, help="examples per fuzz test (default 1000)")
    parser.add_argument("--only", choices=FAULTS, action="append",
                        help="inject only this fault (repeatable); prints, records nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="diagtrain-robustness-") as tmp:
        root = Path(tmp)
        if not args.only:
            inputs = bad_inputs(root / "inputs")
            print(f"bad inputs: {inputs['cases']} cases, {inputs['crashes']} crashes", flush=True)
            fuzz = fuzzing(args.fuzz_examples)
            print(f"fuzzing: {fuzz['result']}", flush=True)
        runs = []
        for kind in args.only or FAULTS:
            for i in range(args.repeats):
                runs.append(_one_fault(kind, root / f"{len(runs)}"))
                print(f"{kind} #{i + 1}: {runs[-1]}", flush=True)
                if "skipped" in runs[-1]:
                    break
    if args.only:
        return
    result = {"machine": machine(), "bad_inputs": inputs, "fuzzing": fuzz, "faults": runs}
    save("robustness", result, markdown(result))


def markdown(result: dict) -> str:
    m, inputs, fuzz, runs = result["machine"], result["bad_inputs"], result["fuzzing"], result["faults"]
    done = [r for r in runs if "skipped" not in r]
    lines = [
        "# Robustness: bad inputs and injected faults", "",
        f"{m['date']}, {m['cpu_count']} cores, torch {m['torch']}, diagtrain {m['diagtrain']}; "
        f"`{m['command']}`. Targets: 0 in every count.", "",
        "| what | tried | crashes | data lost | orphan processes | temp files left | other failures |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| bad inputs ({inputs['files']} files x {inputs['mutations']} mutations, + {inputs['special']} cases "
        f"from the issue) | {inputs['cases']} | {inputs['crashes']} | | | | unnamed {inputs['unnamed']}, "
        f"damaged analysis {inputs['damaged']} |",
        f"| fuzzing ({fuzz['examples_per_test']} random examples per test) | {fuzz['result']} | "
        f"{int(fuzz['failed'])} | | | | |",
    ]
    for kind in FAULTS:
        these = [r for r in runs if r["kind"] == kind]
        if these and "skipped" in these[0]:
            lines.append(f"| {kind} | not run: {these[0]['skipped']} | | | | | |")
            continue
        lines.append(f"| {kind} | {len(these)} | {sum(r['crashed'] for r in these)} | "
                     f"{sum(bool(r['lost']) for r in these)} | {sum(r['orphans'] for r in these)} | "
                     f"{sum(len(r['temp_files']) for r in these)} | |")
    lines += ["", f"Faults injected: {len(done)} runs. Crashes: {sum(r['crashed'] for r in done)}; runs whose "
              f"collected data was lost: {sum(bool(r['lost']) for r in done)}; orphan processes: "
              f"{sum(r['orphans'] for r in done)}.", ""]
    problems = inputs["failures"] + [f"{r['kind']}: {r['lost']}" for r in done if r["lost"]] + [
        f"{r['kind']}: crashed (exit {r['exit_code']}):\n\n```\n{r['stderr_tail']}\n```" for r in done if r["crashed"]]
    if problems:
        lines += ["## What failed", ""] + [f"- {p}" for p in problems] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
