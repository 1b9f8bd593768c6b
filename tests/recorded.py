"""Real run directories recorded once (tests/fixtures/recorded_runs/), for tests of judgement that need no job.

Each was written by ``diagtrain run`` of the command in ``RECORDINGS`` and copied without what the
analysis writes (analysis/, report.*): a test gets a fresh copy and analyzes it itself, so the
judgement of today's code is what it checks. ``python tests/fixtures/recorded_runs/record.py`` records them
again (after a change of the record format) and rewrites each run's golden verdicts (``golden.json``:
every finding's kind, severity, ranks, impact and words), which tests/test_recorded_runs.py holds the analysis to.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "fixtures" / "recorded_runs"
GOLDEN = "golden.json"
# What the analysis writes into a run directory: never recorded, so every test analyzes afresh.
ANALYSIS_OUTPUTS = ("analysis", "report.md", "report.json", "report.html")

# The compare tests' runs (tests/test_compare.py): a 2-rank DDP trainer run of 30 steps, four clean and one
# whose rank 1's forward takes STRAGGLER_MS more (x2.5-x6 of its forward, beyond three clean runs' band).
# One profiled step (not the automatic three) keeps each run's traces small.
COMPARE_TRAINER = ["--strategy", "ddp", "--nproc", "2", "--steps", "30", "--dim", "256", "--seq-len", "64"]
STRAGGLER_MS = 150
RECORDINGS: dict[str, list[str]] = {
    **{f"compare-clean{i}": ["--profile-steps", "10", "--", sys.executable, "-m", "diagtrain.profiler.cli", "train",
                             *COMPARE_TRAINER] for i in (1, 2, 3, 4)},
    "compare-straggler": ["--profile-steps", "10", "--", sys.executable, "-m", "diagtrain.profiler.cli", "train",
                          *COMPARE_TRAINER, "--inject", f"straggler:rank=1,ms={STRAGGLER_MS}"],
    # Live judgement against the final analysis (tests/test_live_replay.py): step records only, no traces.
    "data-stall": ["--profile-steps", "none", "--", sys.executable, "-m", "diagtrain.profiler.cli", "train",
                   *COMPARE_TRAINER, "--inject", f"dataloader_stall:rank=1,ms={STRAGGLER_MS}"],
    # Two independent hangs (tests/test_hang_origins.py): rank 1 and rank 3 stop, one in each data-parallel group.
    "two-hangs": ["--hang-timeout", "3", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node=4", str(REPO / "tests" / "scripts" / "two_hangs.py")],
    "leak": ["--profile-steps", "none", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", str(REPO / "benchmarks" / "user_scripts" / "ddp_loader.py"), "--steps", "30",
             "--leak-rank", "1", "--leak-mb", "16"],
    # The origin, not the victim (tests/test_origins.py): rank 1 skips its 5th batch (`continue` before backward),
    # runs a step's collectives ahead, ends its script after step 9; rank 0 dies waiting ("Connection closed by peer").
    "early-exit": ["--profile-steps", "none", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node=2", str(REPO / "benchmarks" / "user_scripts" / "ddp_loader.py"), "--steps", "10",
                   "--skip-rank", "1", "--skip-step", "5"],
}


# tests/test_analyze.py's pipeline verdicts, judgement only: the injectors' effects on the layout and the
# schedule are tests/test_strategies.py's, on real jobs. Step records only (the stages' work by the counters).
PIPELINE_TRAINER = [sys.executable, "-m", "diagtrain.profiler.cli", "train", "--strategy", "pp", "--nproc", "2",
                    "--steps", "5"]
RECORDINGS |= {
    "pp-one-microbatch": ["--profile-steps", "none", "--", *PIPELINE_TRAINER, "--schedule", "gpipe",
                          "--inject", "few_microbatches:microbatches=1"],
    # 9 blocks to 1: with 5 to 1 (2.6x when quiet) a step beside two CPU hogs measured 1.6x, near the 1.5x threshold.
    "pp-imbalance": ["--profile-steps", "none", "--", *PIPELINE_TRAINER, "--layers", "10",
                     "--inject", "pp_imbalance:stage=0,layers=9"],
}


# tests/test_user_scripts.py's pipelines written by hand or with torch.distributed.pipelining: their stages,
# microbatches and bottleneck are counted (sends, matrix-multiply FLOPs), never timed, so judged on recordings.
USER_SCRIPTS = REPO / "benchmarks" / "user_scripts"
USER_PIPELINE = ["--profile-steps", "3-5", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node=2"]
RECORDINGS |= {
    "torch-pipelining-gpipe": [*USER_PIPELINE, str(USER_SCRIPTS / "pipeline.py"), "--schedule", "gpipe",
                               "--split", "2,6", "--steps", "6"],
    "sendrecv-pipeline": [*USER_PIPELINE, str(USER_SCRIPTS / "sendrecv_pipeline.py"), "--split", "6,2", "--steps", "6"],
}


def copy_run(name: str, to: Path) -> Path:
    """A fresh, writable copy of the recorded run ``name`` at ``to`` (not analyzed)."""
    source = RUNS / name
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: no such recorded run (python tests/fixtures/recorded_runs/record.py records it)")
    shutil.copytree(source, to, ignore=shutil.ignore_patterns(GOLDEN))
    return to


def verdicts(report: dict) -> list[dict]:
    """What a golden file holds of a report: each finding's kind, severity, ranks, impact and words, in the report's
    order (the words as composed: a change of who writes them must leave them as they were)."""
    return [{"kind": f["kind"], "severity": f["severity"], "ranks": f["ranks"],
             "impact_ms": None if f["impact_ms"] is None else round(f["impact_ms"], 3),
             "explanation": f["explanation"], "suggestion": f["suggestion"]} for f in report["findings"]]
