"""What the critical path adds to an analysis: its two stages' time against the whole analysis, in one run.

    python benchmarks/critical_path_speed.py [--reps 3] [--sets 8,1M,gloo]

The whole pipeline runs in this process with one worker (``analyze(..., workers=1)``), so both added
stages run here and are timed inside the same run as the total: the per-rank work segments (in the
loader, from each rank's events) and the per-step graphs, replays and paths. Without the graph the
analysis would take the total minus those two; the ratio (total / that) is the slowdown the issue
bounds at 1.5x. Comparing within one run keeps a shared machine's load out of the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, save
from synthetic import relabeled_copies, trace_set

from diagtrain.profiler.analyzer import analyze
from diagtrain.profiler.analyzer.per_rank import pipeline, work_segments
from diagtrain.profiler.analyzer.run import replay
SHARED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "public" / "traces" / "hta"
REAL = SHARED / "nccl_2rank_rank0.json.gz"
SETS = {
    "8": ("8 ranks of a real NCCL trace", lambda d: relabeled_copies(REAL, d, 8)),
    "1M": ("synthetic 1M events, 1 rank", lambda d: trace_set(d, 1, 1_000_000)),
    "gloo": ("real CPU (gloo) trace, 1 rank", lambda d: _single(SHARED / "cpu_only_gloo_rank34.json.gz", d)),
}


def _single(source: Path, folder: Path) -> Path:
    (folder / source.name).symlink_to(source)
    return folder


class _Timed:
    """Wraps a function and sums the seconds spent in it."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def measure(folder: Path) -> dict:
    """One in-process analysis of ``folder``: total seconds and the two added stages' seconds."""
    segments, paths = _Timed(work_segments.rank_segments), _Timed(replay.analyze)
    # pipeline._segments calls the first, judge/judgement.py the second, through their modules.
    pipeline.rank_segments, replay.analyze = segments, paths
    try:
        with tempfile.TemporaryDirectory() as scratch:
            start = time.perf_counter()
            analyze.analyze(folder, Path(scratch), ["json"], workers=1)
            total = time.perf_counter() - start
    finally:
        pipeline.rank_segments, replay.analyze = segments.fn, paths.fn
    added = segments.seconds + paths.seconds
    return {"total_s": total, "segments_s": segments.seconds, "paths_s": paths.seconds,
            "ratio": total / (total - added)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sets", default=",".join(SETS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for key in args.sets.split(","):
            name, make = SETS[key]
            folder = Path(root) / key
            folder.mkdir()
            make(folder)
            reps = [measure(folder) for _ in range(args.reps)]
            row = {"set": name, **{k: statistics.median(r[k] for r in reps) for k in reps[0]}, "reps": reps}
            rows.append(row)
            print(f"{name}: {row['total_s']:.2f} s, segments {row['segments_s']:.3f} s, paths {row['paths_s']:.3f} s, "
                  f"ratio {row['ratio']:.3f}", file=sys.stderr)
    m = machine()
    lines = ["# Critical path: analysis time with the graph against without", "",
             f"{m['date']}, {m.get('cpu_count')} cores. Command: `critical_path_speed.py --reps {args.reps}`. One "
             "in-process analysis per measurement (one worker), medians; the two added stages timed inside it.", "",
             "| trace set | analysis s | work segments s | graphs + paths s | with / without |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['set']} | {r['total_s']:.2f} | {r['segments_s']:.3f} | {r['paths_s']:.3f} | {r['ratio']:.3f}x |"
              for r in rows]
    lines += ["", "Target: with / without <= 1.5x (issue 21).", ""]
    save("critical_path_speed", {"machine": m, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
