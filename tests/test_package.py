"""The wheel carries every subpackage under the `diagtrain` namespace, and the console script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("profiler", "dashboard", "reference_trainers")


def test_wheel_contains_every_subpackage(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("diagtrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for sub in SUBPACKAGES:
        folder = REPO / sub
        for source in folder.rglob("*.py"):
            inside = source.relative_to(folder).as_posix()
            assert f"diagtrain/{sub}/{inside}" in names, f"{sub}/{inside} missing from the wheel"
    assert "diagtrain/dashboard/assets/diagtrain.css" in names  # Dash serves it from the installed package
    assert "diagtrain/profiler/plan/gpus.json" in names  # the planner's GPU table
    assert not any(n.startswith(("tests/", "benchmarks/", "diagtrain/tests")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "diagtrain = diagtrain.profiler.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
