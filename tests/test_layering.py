"""The tree reads as the data flow, and stays so: which stage may import which (docs/contributing/architecture.md, "Rules of the house").

Every import in the package is read from the source (module-level and inside functions alike) and
checked against the table below. A new module needs no entry here unless it opens a new stage.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Source folder -> import name, as pyproject's package-dir maps them.
ROOTS = {"profiler": "diagtrain.profiler", "dashboard": "diagtrain.dashboard",
         "reference_trainers": "diagtrain.reference_trainers"}

# Stages, most specific prefix first. Shared parts (the run-directory contract, small utilities)
# are stages too, so that they are held to importing nothing above them.
STAGES = {
    "diagtrain.profiler.run_dir": "contract",
    "diagtrain.profiler.step_files": "contract",  # reading and following the ranks' step-record files
    "diagtrain.profiler.util": "util",
    "diagtrain.profiler.instrument": "rank",  # the public path of the in-rank API, a re-export
    "diagtrain.profiler.rank": "rank",
    "diagtrain.profiler.collect": "collect",
    "diagtrain.profiler.analyzer": "analyzer",
    "diagtrain.profiler.compare": "compare",
    "diagtrain.profiler.export": "export",
    "diagtrain.profiler.model": "model",
    "diagtrain.profiler.plan": "plan",
    "diagtrain.profiler.cli": "cli",
    "diagtrain.profiler": "package",  # the package's own __init__
    "diagtrain.dashboard": "dashboard",
    "diagtrain.reference_trainers": "trainers",
    "diagtrain": "api",  # `import diagtrain` and diagtrain.notebook (api/): the Python API for notebooks
}
SHARED = {"contract", "util"}
# What each stage may import besides itself and the shared parts. Only the CLI calls across
# stages (and through it, the launcher's end-of-run hand-off to the analyzer).
MAY_IMPORT = {
    "contract": set(),
    "util": set(),
    "rank": set(),
    "collect": set(),
    "analyzer": {"model", "plan"},  # holds every run against the cost model and the plan's count of its layout
    "compare": set(),
    "export": set(),  # reads the analysis' published outputs (files), as the dashboard does
    "model": set(),  # the cost model the planner and the analyzer share: pure formulas over numbers
    "plan": {"model"},  # the planner: pure functions over model and cluster descriptions
    "dashboard": {"analyzer", "compare", "model", "plan"},  # reads the analysis and compares two of them
    "trainers": {"rank"},  # a user of the public in-rank API (StepRecorder)
    "cli": {"rank", "collect", "analyzer", "compare", "export", "model", "plan", "dashboard", "trainers"},
    "package": set(),
    "api": {"analyzer", "dashboard"},  # analyzes where needed, reads the published analysis, draws the dashboard's figures
}
# The in-rank code runs inside the user's job: besides the standard library it may load torch,
# and nothing that would change the job's imports or start-up (pandas, pyarrow, dash, rich...).
RANK_THIRD_PARTY = {"torch"}


def stage_of(module: str) -> str | None:
    """The stage a ``diagtrain.*`` module belongs to (None for modules outside the package)."""
    for prefix in sorted(STAGES, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return STAGES[prefix]
    return None


def modules() -> dict[str, Path]:
    """Every Python module of the package, by import name."""
    found = {}
    for folder, name in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if "bootstrap" in parts:  # a plain folder put on the ranks' PYTHONPATH
                found[f"{name}.rank.bootstrap.{parts[-1]}"] = path
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((name, *parts))] = path
    return found


def imports(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def violations() -> list[str]:
    """Every import that crosses the stages the wrong way."""
    found = []
    for module, path in sorted(modules().items()):
        stage = stage_of(module)
        allowed = {stage} | SHARED | MAY_IMPORT[stage]
        for name in sorted(imports(path, module)):
            target = stage_of(name)
            if name.startswith("diagtrain.") and target is not None and target not in allowed:
                found.append(f"{path.relative_to(REPO)}: the {stage} stage imports {name} ({target})")
            top = name.split(".")[0]
            if stage == "rank" and top != "diagtrain" and top not in sys.stdlib_module_names \
                    and top not in RANK_THIRD_PARTY:
                found.append(f"{path.relative_to(REPO)}: in-rank code imports {name}")
    return found


# Inside the analyzer, the folders are its stages in the order data flows through them; a stage reads
# only what the stages before it made. The analyzer's own top-level modules (the pipeline that runs
# the stages, the settings every stage declares) sit above and beside them.
ANALYZER = "diagtrain.profiler.analyzer"
ANALYZER_STAGES = ("read", "per_rank", "run", "judge", "report")
ANALYZER_SHARED = {f"{ANALYZER}.settings"}


def analyzer_stage(module: str) -> int | None:
    """Position of an analyzer module's stage in the flow (None outside the stage folders)."""
    parts = module.split(".")
    if module.startswith(ANALYZER + ".") and len(parts) >= 4 and parts[3] in ANALYZER_STAGES:
        return ANALYZER_STAGES.index(parts[3])
    return None


def analyzer_violations() -> list[str]:
    """Every import by which an analyzer stage reaches forward, to a stage after its own."""
    found = []
    for module, path in sorted(modules().items()):
        own = analyzer_stage(module)
        if own is None:
            continue
        for name in sorted(imports(path, module)):
            target = analyzer_stage(name)
            if target is not None and target > own:
                found.append(f"{path.relative_to(REPO)}: the {ANALYZER_STAGES[own]} stage imports {name} "
                             f"({ANALYZER_STAGES[target]}, later in the flow)")
            elif name.startswith(ANALYZER + ".") and target is None and name not in ANALYZER_SHARED \
                    and not any(name == s or name.startswith(s + ".") for s in ANALYZER_SHARED):
                found.append(f"{path.relative_to(REPO)}: the {ANALYZER_STAGES[own]} stage imports {name}, "
                             "which runs the stages")
    return found


# Inside judge/, its rooms in the order judgement runs them: the detectors read tables only; the assessments weigh
# the detectors' candidates; judgement.py orders both, and live_judge.py follows it while a job runs. A room may not
# import the ones after it (the shared vocabulary beside them, findings, kinds, verdict..., any may).
JUDGE = f"{ANALYZER}.judge"
JUDGE_NOT = {
    "detectors": ("assessments", "model_check", "live_judge", "judgement"),
    "assessments": ("live_judge", "judgement"),
}


def judge_violations() -> list[str]:
    """Every import by which a room of judge/ reaches one judged after it."""
    found = []
    for module, path in sorted(modules().items()):
        parts = module.split(".")
        if not module.startswith(JUDGE + ".") or len(parts) < 5 or parts[4] not in JUDGE_NOT:
            continue
        banned = [f"{JUDGE}.{room}" for room in JUDGE_NOT[parts[4]]]
        for name in sorted(imports(path, module)):
            if any(name == b or name.startswith(b + ".") for b in banned):
                found.append(f"{path.relative_to(REPO)}: judge/{parts[4]}/ imports {name}, judged after it")
    return found


def test_every_module_belongs_to_a_stage():
    unplaced = [m for m in modules() if stage_of(m) is None]
    assert not unplaced
    # The tree names the stages of the flow: a newcomer sees them before opening a file.
    folders = {p.name for p in (REPO / "profiler").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert {"rank", "collect", "analyzer", "compare", "model", "plan", "cli", "util"} <= folders


def test_no_stage_reaches_across_the_flow():
    assert violations() == []


def test_the_analyzer_reads_in_the_order_data_flows():
    folders = {p.name for p in (REPO / "profiler" / "analyzer").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ANALYZER_STAGES)
    # Nothing but the pipeline and the shared settings stands beside the stage folders.
    loose = {p.stem for p in (REPO / "profiler" / "analyzer").glob("*.py")}
    assert loose <= {"__init__", "analyze", "settings"}
    assert analyzer_violations() == []


def test_the_analyzer_check_catches_a_forward_import(tmp_path, monkeypatch):
    fake = tmp_path / "profiler" / "analyzer" / "read"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text("from ..judge import straggler\nfrom diagtrain.profiler.analyzer.analyze import analyze\n"
                                 "from diagtrain.profiler.analyzer.read import inputs\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", {"profiler": "diagtrain.profiler"})
    found = analyzer_violations()
    assert any("imports diagtrain.profiler.analyzer.judge (judge, later in the flow)" in v for v in found)
    assert any("imports diagtrain.profiler.analyzer.analyze, which runs the stages" in v for v in found)
    assert not any("read.inputs" in v or v.endswith("analyzer.read, which runs the stages") for v in found)


def test_the_check_catches_a_wrong_import(tmp_path, monkeypatch):
    # The checker itself must see lazy imports, relative imports and `from package import module`.
    fake = tmp_path / "profiler" / "analyzer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text(
        "def f():\n    from diagtrain.profiler.collect import manifest\n"
        "from ..rank import instrument\nfrom diagtrain.profiler import collect\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", {"profiler": "diagtrain.profiler"})
    found = violations()
    assert any("diagtrain.profiler.collect.manifest (collect)" in v for v in found)
    assert any("diagtrain.profiler.rank.instrument (rank)" in v for v in found)
    assert any("imports diagtrain.profiler.collect (collect)" in v for v in found)


def test_the_public_in_rank_path_still_works():
    from diagtrain.profiler.instrument import StepRecorder
    from diagtrain.profiler.rank.instrument import StepRecorder as InRank

    assert StepRecorder is InRank


def test_the_judges_rooms_keep_their_order():
    assert judge_violations() == []


def test_the_judge_check_catches_a_detector_reading_an_assessment(tmp_path, monkeypatch):
    fake = tmp_path / "profiler" / "analyzer" / "judge" / "detectors"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from ..assessments.contention import host_loads\n"
                                 "from diagtrain.profiler.analyzer.judge import judgement\n"
                                 "from diagtrain.profiler.analyzer.judge.findings import Candidate\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", {"profiler": "diagtrain.profiler"})
    found = judge_violations()
    assert any("imports diagtrain.profiler.analyzer.judge.assessments.contention" in v for v in found)
    assert any("imports diagtrain.profiler.analyzer.judge.judgement" in v for v in found)
    assert not any("findings" in v for v in found)
