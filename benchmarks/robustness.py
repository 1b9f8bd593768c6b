"""Robustness, counted: bad inputs given to the analysis and faults injected into real runs.

    python benchmarks/robustness.py [--repeats 3] [--fuzz-examples 1000] [--mutations 3]
    python benchmarks/robustness.py --mutated-only [--mutations 3]   # part 4 alone, into its section

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

4. Mutated real files: every shared trace (traces/hta, traces/tracelens) and flight-recorder dump,
   damaged ``--mutations`` times per kind (a handful of bad events of each kind of
   tests/test_damaged_inputs.py, a random mix of them, a cut gzip stream, a cut JSON document; dumps:
   cut JSON, a garbled entry, a cut pickle) and read as a rank's load reads them. Counted: crashes,
   hangs (over HANG_S), ranks kept, events dropped, ranks thrown away with under 1% bad events, cut
   traces not analyzed as partial.

Targets: 0 of every count.
"""

from __future__ import annotations

import argparse
import gzip
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

from common import RESULTS, machine, save

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import test_bad_inputs as corpus  # noqa: E402 - the suite's corpus, run here in full
import test_damaged_inputs as damage  # noqa: E402 - the kinds of damage to real files
import test_job_faults as faults  # noqa: E402
from conftest import USER_SCRIPT, processes_with, torchrun  # noqa: E402

from diagtrain.profiler.analyzer.report import document as report  # noqa: E402
from diagtrain.profiler.analyzer.analyze import analyze  # noqa: E402
from diagtrain.profiler.analyzer.per_rank.pipeline import UnreadableRank  # noqa: E402
from diagtrain.profiler.analyzer.read.trace_file import TraceError  # noqa: E402

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


# -- mutated real files ------------------------------------------------------------------------

HANG_S = 120  # one case's limit: a real shared file reads in seconds


def _bounded(work):  # -> (result or exception, hung)
    """``work()`` under an alarm: its result or the exception it raised, and whether it hung."""
    def alarm(*_):
        raise TimeoutError
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        return work(), False
    except TimeoutError as e:
        return e, True
    except Exception as e:  # noqa: BLE001 - counted
        return e, False
    finally:
        signal.alarm(0)


def _trace_cases(name: str, rng, mutations: int) -> list[tuple[str, str, float]]:
    """(kind, text or '' for a cut gzip, share of bad events) for one shared trace."""
    doc = damage.clean_doc(name)
    rows = damage.duration_rows(doc)
    handful = max(1, len(rows) // 200)  # 0.5% of the duration events
    cases = []
    for _ in range(mutations):
        for kind in [*damage.DAMAGES, "mix"]:
            bad = rng.sample(rows, handful)
            kinds = [rng.choice(list(damage.DAMAGES)) if kind == "mix" else kind for _ in bad]
            cases.append((kind, damage.layout(damage.damaged(doc, bad, kinds))[0], handful / len(rows)))
        text = damage.layout(doc)[0]
        for kind in ("truncated gzip", "truncated JSON"):
            cases.append((kind, text[:rng.randrange(len(text) // 10, len(text) - 2)], 0.0))
    return cases


def _one_trace(path: Path, cache: Path) -> dict:
    from diagtrain.profiler.analyzer.per_rank.pipeline import _read_traces, load_rank
    from diagtrain.profiler.analyzer.read.discover import RankInput
    item = RankInput(path.name, [path], 0)
    traces, impossible, _ = _read_traces(item)
    load_rank(item, cache)
    return {"dropped": traces[0].left_out + impossible, "partial": traces[0].cut is not None,
            "device_unknown": traces[0].device_time_unknown}


def mutated_files(root: Path, mutations: int) -> dict:
    """The shared traces and dumps under every kind of damage, ``mutations`` times each: counts per folder."""
    import random
    rng = random.Random(41)
    rows = {}
    for name, source in damage.TRACES.items():
        row = rows.setdefault(source.parent.name, {"files": 0, "cases": 0, "crashes": 0, "hangs": 0, "kept": 0,
                                                   "dropped": 0, "thrown_under_1pct": 0, "cut": 0, "cut_partial": 0,
                                                   "cut_device_unknown": 0})
        row["files"] += 1
        for i, (kind, text, share) in enumerate(_trace_cases(name, rng, mutations)):
            path = root / f"{name}-{i}" / ("trace.json" if kind == "truncated JSON" else "trace.json.gz")
            path.parent.mkdir(parents=True)
            if kind == "truncated gzip":
                packed = gzip.compress(damage.layout(damage.clean_doc(name))[0].encode(), mtime=0)
                path.write_bytes(packed[:rng.randrange(len(packed) // 10, len(packed) - 8)])
            else:
                damage.write(path, text)
            found, hung = _bounded(lambda: _one_trace(path, path.parent / "cache"))
            row["cases"] += 1
            row["hangs"] += hung
            failed = isinstance(found, BaseException)
            row["crashes"] += failed and not hung and not isinstance(found, (TraceError, UnreadableRank))
            row["thrown_under_1pct"] += failed and 0 < share < 0.01
            row["kept"] += not failed
            row["dropped"] += found["dropped"] if not failed else 0
            if kind.startswith("truncated") and not failed:
                row["cut"] += 1
                row["cut_partial"] += found["partial"]
                row["cut_device_unknown"] += found["device_unknown"]
            shutil.rmtree(path.parent)
    rows["flight-recorder dumps"] = _mutated_dumps(root / "dumps", rng, mutations)
    return {"mutations": mutations, "rows": rows}


def _mutated_dumps(root: Path, rng, mutations: int) -> dict:
    """Real dumps cut (as JSON and as the pickles they are) and with a garbled JSON entry."""
    from diagtrain.profiler.analyzer.read import flight_records as fr
    from diagtrain.profiler.util.bounded_read import InputError
    row = {"files": len(damage.DUMPS), "cases": 0, "crashes": 0, "hangs": 0, "kept": 0, "dropped": 0,
           "thrown_under_1pct": 0, "cut": 0, "cut_partial": 0}
    root.mkdir(parents=True)
    for dump in damage.DUMPS:
        doc = fr.read_dump(dump)
        doc.pop("malformed_entries")
        text, pickled = json.dumps(doc), dump.read_bytes()
        garbled = json.dumps({**doc, "entries": ["@"]}).replace('"@"', '{"record_id": 1,, }')
        for _ in range(mutations):
            for kind, data in (("cut JSON", text[:rng.randrange(len(text) // 10, len(text) - 2)].encode()),
                               ("garbled entry", garbled.encode()),
                               ("cut pickle", pickled[:rng.randrange(2, len(pickled) - 1)])):
                path = root / "dump_0"
                path.write_bytes(data)
                found, hung = _bounded(lambda: fr.read_dump(path))
                row["cases"] += 1
                row["hangs"] += hung
                refused = isinstance(found, InputError)
                row["crashes"] += isinstance(found, BaseException) and not refused and not hung
                row["kept"] += not isinstance(found, BaseException)
                row["dropped"] += found.get("malformed_entries", 0) if isinstance(found, dict) else 0
                if kind.startswith("cut"):  # a cut JSON dump keeps its entries; a cut pickle is refused, saying so
                    row["cut"] += 1
                    row["cut_partial"] += bool(found.get("cut_short")) if isinstance(found, dict) else \
                        refused and "ends early" in found.reason
    return row


def mutated_markdown(result: dict) -> list[str]:
    """The table of part 4."""
    lines = [f"## Mutated real files ({result['mutations']} mutations of each kind per file)", "",
             "| folder | files | cases | crashes | hangs | ranks kept | events dropped | thrown away with <1% bad "
             "| cut, analyzed as partial | cut, device time not reported |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for folder, r in result["rows"].items():
        lines.append(f"| {folder} | {r['files']} | {r['cases']} | {r['crashes']} | {r['hangs']} | {r['kept']} | "
                     f"{r['dropped']} | {r['thrown_under_1pct']} | {r['cut_partial']} of {r['cut']} | "
                     f"{r.get('cut_device_unknown', '')} |")
    return lines + [""]


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
    parser.add_argument("--mutations", type=int, default=3, help="mutations of each kind per real file (default 3)")
    parser.add_argument("--mutated-only", action="store_true",
                        help="run part 4 alone; its table replaces the one in the recorded results")
    args = parser.parse_args()
    if args.mutated_only:
        with tempfile.TemporaryDirectory(prefix="diagtrain-mutated-") as tmp:
            mutated = mutated_files(Path(tmp), args.mutations)
        recorded = json.loads((RESULTS / "robustness.json").read_text())
        recorded["mutated_files"] = {**mutated, "machine": machine()}
        save("robustness", recorded, markdown(recorded))
        return
    with tempfile.TemporaryDirectory(prefix="diagtrain-robustness-") as tmp:
        root = Path(tmp)
        if not args.only:
            inputs = bad_inputs(root / "inputs")
            print(f"bad inputs: {inputs['cases']} cases, {inputs['crashes']} crashes", flush=True)
            fuzz = fuzzing(args.fuzz_examples)
            print(f"fuzzing: {fuzz['result']}", flush=True)
            mutated = mutated_files(root / "mutated", args.mutations)
        runs = []
        for kind in args.only or FAULTS:
            for i in range(args.repeats):
                runs.append(_one_fault(kind, root / f"{len(runs)}"))
                print(f"{kind} #{i + 1}: {runs[-1]}", flush=True)
                if "skipped" in runs[-1]:
                    break
    if args.only:
        return
    result = {"machine": machine(), "bad_inputs": inputs, "fuzzing": fuzz, "faults": runs, "mutated_files": mutated}
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
    if "mutated_files" in result:
        mutated = result["mutated_files"]
        ran = f" ({mutated['machine']['date']}, `{mutated['machine']['command']}`)" if "machine" in mutated else ""
        lines += mutated_markdown(mutated)[:2] + [f"Run{ran or ' with the rest'}. Dumps: ranks kept counts dumps "
                 "read, events dropped counts entries left out, and a cut pickle counts as analyzed when it is "
                 "refused saying it ends early (a pickle cannot be read in part safely). A trace cut before its first "
                 "complete event has nothing to keep: it is refused (ranks kept and the cut column leave it out). "
                 "A trace cut among device work written with its launches (Kineto's CUPTI layout, whose buffers need "
                 "not come in time order) can have lost work anywhere in its window: its device time is not "
                 "reported (the last column); one that wrote every launch first ends its window at the first launch "
                 "left unanswered.", ""] + mutated_markdown(mutated)[2:]
    problems = inputs["failures"] + [f"{r['kind']}: {r['lost']}" for r in done if r["lost"]] + [
        f"{r['kind']}: crashed (exit {r['exit_code']}):\n\n```\n{r['stderr_tail']}\n```" for r in done if r["crashed"]]
    if problems:
        lines += ["## What failed", ""] + [f"- {p}" for p in problems] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
