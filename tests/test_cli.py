"""The command line: help, refusals with exit code 2 before any process starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

USAGE = 2


def diagtrain(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def test_help_explains_the_train_command():
    proc = diagtrain("train", "--help")
    assert proc.returncode == 0
    assert "--strategy {ddp,fsdp,tp,pp,3d}" in proc.stdout and "straggler:rank=R" in proc.stdout


def test_the_command_line_starts_without_pandas_or_torch():
    """`diagtrain --help` and the start of `diagtrain run` import neither: half a second and more each."""
    code = ("import sys; from diagtrain.profiler.cli import build_parser; build_parser(); "
            "print(sorted({'pandas', 'pyarrow', 'torch'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_no_command_is_a_usage_error():
    proc = diagtrain()
    assert proc.returncode == USAGE and "required" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--strategy", "zero"], "invalid choice: 'zero'"),
    (["--strategy", "3d", "--nproc", "8", "--mesh", "2x2x3"], "--mesh 2x2x3 (pp x dp x tp) has 12 ranks, but --nproc is 8"),
    (["--strategy", "3d", "--nproc", "8", "--mesh", "2x4"], "expected PPxDPxTP"),
    (["--strategy", "ddp", "--mesh", "1x2x1"], "--mesh applies to --strategy 3d only"),
    (["--strategy", "tp", "--nproc", "3"], "--heads 8 is not divisible by the tensor-parallel degree 3"),
    (["--strategy", "ddp", "--inject", "straggler:rank=1"], "straggler needs exactly one of ms or factor"),
    (["--strategy", "ddp", "--inject", "teleport:rank=1"], "unknown fault kind 'teleport'"),
    (["--strategy", "ddp", "--inject", "straggler:rank=7,ms=5"], "rank 7 is outside 0..1"),
    (["--strategy", "ddp", "--inject", "pp_imbalance:stage=0,layers=3"], "needs a pipeline"),
    (["--strategy", "pp", "--inject", "few_microbatches:microbatches=1"], "1F1B schedule needs at least as many microbatches"),
    (["--strategy", "ddp", "--profile-steps", "5-3"], "--profile-steps '5-3': the range ends before it starts"),
    (["--strategy", "ddp", "--schedule", "gpipe"], "--schedule applies to pipeline runs"),
    (["--strategy", "ddp", "--out", "/proc/diagtrain-cannot-write"], "--out /proc/diagtrain-cannot-write: cannot write there"),
])
def test_bad_input_is_refused_before_any_process_starts(tmp_path, args, message):
    proc = diagtrain("train", *args, cwd=tmp_path)
    assert proc.returncode == USAGE, proc.stderr
    assert message in proc.stderr
    assert "torch.distributed" not in proc.stderr  # no launcher, no rank ever ran
    assert list(tmp_path.iterdir()) == []  # no run directory was made


def test_a_bare_rank_refuses_the_same_input(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "diagtrain.reference_trainers", "--strategy", "tp", "--heads", "3"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "WORLD_SIZE": "2"},
    )
    assert proc.returncode == USAGE
    assert "--dim 64 is not divisible by --heads 3" in proc.stderr
