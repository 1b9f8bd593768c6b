"""Thresholds are typed settings: listed with their reasons, changed per analysis, recorded in the report."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagtrain.profiler.util import settings
from diagtrain.profiler.analyzer.judge.judgement import DETECTORS, all_sections, detector_modules
from diagtrain.profiler.run_dir import write_json_atomic

REPO = Path(__file__).resolve().parent.parent
JUDGE = REPO / "profiler" / "analyzer" / "judge"
T0 = 1_790_000_000.0


def diagtrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", *args], capture_output=True, text=True,
                          timeout=300)


def slow_forward_run(root: Path, slow_rank: int = 2, extra_ms: float = 200.0) -> Path:
    """Four ranks' step records in which ``slow_rank``'s forward takes ``extra_ms`` more in every step."""
    for rank in range(4):
        folder = root / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "host": "node-a", "hostname": "node-a", "pid": 1,
                                                 "world_size": 4})
        lines = []
        for s in range(1, 9):
            forward = 300.0 + (extra_ms if rank == slow_rank else 0.0) + 3.0 * ((s + rank) % 3)
            lines.append(json.dumps({"rank": rank, "step": s, "start": T0 + s - 1, "end": T0 + s, "duration_ms": 1000.0,
                                     "phases_ms": {"forward": forward, "backward": 600.0}}))
        (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _numeric(node: ast.AST) -> bool:
    """A literal number, or arithmetic / a tuple over literal numbers only."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    return False


def bare_thresholds(folder: Path) -> list[str]:
    """Module-level names bound to numbers in the judging modules: thresholds outside a settings class."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            if value is not None and _numeric(value):
                found += [f"{path.relative_to(folder)}:{node.lineno} {ast.unparse(t)}" for t in targets]
    return found


def test_no_judging_module_holds_a_bare_numeric_threshold():
    assert bare_thresholds(JUDGE) == []


def test_the_scan_sees_a_bare_threshold(tmp_path):
    (tmp_path / "fake.py").write_text("LIMIT_MS = 5.0\nSHARES = (0.5, 1 / 3)\nNAMES = ('data',)\n"
                                      "class S:\n    inside: float = 2.0\n")
    found = bare_thresholds(tmp_path)
    assert [f.split()[-1] for f in found] == ["LIMIT_MS", "SHARES"]


def test_every_setting_is_typed_and_has_a_reason():
    sections = all_sections()
    rows = settings.describe()
    assert len({r["key"] for r in rows}) == len(rows)
    assert {r["key"].partition(".")[0] for r in rows} == set(sections)
    for row in rows:
        assert row["reason"].strip() and row["type"] in ("int", "float", "bool", "str"), row
    # Every detector declares what it judges with, so its findings carry those values.
    for name, module in detector_modules().items():
        assert getattr(module, "SETTINGS", None), f"detector {name} declares no SETTINGS"
    assert set(DETECTORS) == set(detector_modules())


def test_overrides_are_parsed_by_type_and_bad_ones_named():
    parsed = settings.parse(["straggler.min_excess_ms=300", "straggler.min_steps=4"])
    assert parsed == {"straggler": {"min_excess_ms": 300.0, "min_steps": 4}}
    assert isinstance(parsed["straggler"]["min_steps"], int)
    for bad, words in [("straggler.min_steps=2.5", "not a valid int"), ("nosuch.x=1", "no section 'nosuch'"),
                       ("straggler.nosuch=1", "has no setting 'nosuch'"), ("straggler=1", "SECTION.NAME=VALUE"),
                       ("straggler.min_excess_ms=nan", "not a valid float")]:
        with pytest.raises(settings.SettingError, match=words):
            settings.parse([bad])


def test_an_override_is_in_force_only_inside_its_analysis():
    from diagtrain.profiler.analyzer.judge.detectors.straggler import Straggler

    with settings.overriding(settings.parse(["straggler.min_excess_ms=300"])):
        assert Straggler.active().min_excess_ms == 300.0
        assert Straggler.active().min_steps == Straggler().min_steps
    assert Straggler.active().min_excess_ms == Straggler().min_excess_ms


def test_settings_made_once_follow_every_change_of_overrides():
    """active() keeps the settings it made (asked 1,024 times a live judgement): a new override, a nested one, the
    same dict changed in place and a thread of its own each get their own values."""
    import threading

    from diagtrain.profiler.analyzer.judge.detectors.straggler import Straggler

    assert Straggler.active() is Straggler.active()  # made once while nothing changes
    overrides = settings.parse(["straggler.min_excess_ms=300"])
    with settings.overriding(overrides):
        assert Straggler.active().min_excess_ms == 300.0
        with settings.overriding(settings.parse(["straggler.min_excess_ms=40"])):
            assert Straggler.active().min_excess_ms == 40.0
        assert Straggler.active().min_excess_ms == 300.0
        overrides["straggler"]["min_excess_ms"] = 7.0  # nobody should; if somebody does, it is seen
        assert Straggler.active().min_excess_ms == 7.0
        seen = []
        worker = threading.Thread(target=lambda: seen.append(Straggler.active().min_excess_ms))  # a fresh context
        worker.start()
        worker.join()
        assert seen == [Straggler().min_excess_ms]
    assert Straggler.active().min_excess_ms == Straggler().min_excess_ms


@pytest.mark.jobs
def test_set_changes_the_verdict_and_the_report_records_it(tmp_path):
    run = slow_forward_run(tmp_path / "run")
    done = diagtrain("analyze", str(run), "--format", "json", "--quiet", "--workers", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads((run / "report.json").read_text())
    [straggler] = [f for f in report["findings"] if f["kind"] == "straggler"]
    assert straggler["ranks"] == [2] and straggler["severity"] in ("warning", "error")
    assert straggler["settings"]["straggler.min_excess_ms"] == 5.0
    assert report["settings"]["overridden"] == {}

    # Above the injected 200 ms the same run has no straggler, and the report says what was changed.
    done = diagtrain("analyze", str(run), "--format", "json", "--quiet", "--workers", "1",
                     "--set", "straggler.min_excess_ms=250", "--set", "straggler.unknown_noise_share=0.3")
    assert done.returncode == 0, done.stderr
    report = json.loads((run / "report.json").read_text())
    assert not [f for f in report["findings"] if f["kind"] == "straggler"]
    assert report["settings"]["overridden"] == {"straggler.min_excess_ms": 250.0, "straggler.unknown_noise_share": 0.3}
    assert report["settings"]["values"]["straggler.min_excess_ms"] == 250.0


@pytest.mark.jobs
@pytest.mark.parametrize("arg, words", [("straggler.min_excess_ms=fast", "straggler.min_excess_ms='fast': not a valid float"),
                                        ("straggler.no_such=1", "straggler has no setting 'no_such'")])
def test_a_bad_set_exits_2_naming_it(tmp_path, arg, words):
    run = slow_forward_run(tmp_path / "run")
    done = diagtrain("analyze", str(run), "--set", arg)
    assert done.returncode == 2 and words in done.stderr
    assert not (run / "analysis").exists()  # refused before anything was written


@pytest.mark.jobs
def test_settings_lists_every_setting_as_markdown_and_json():
    all_sections()
    from diagtrain.profiler.compare import thresholds  # noqa: F401 - compare's settings are listed too
    md, js = diagtrain("analyze", "--settings"), diagtrain("analyze", "--settings", "json")
    assert md.returncode == 0 and js.returncode == 0
    rows = json.loads(js.stdout)
    assert rows == json.loads(json.dumps(settings.describe()))
    assert "| `straggler.min_excess_ms` | 5.0 |" in md.stdout and "| `compare.one_run_ceiling` | 2.5 |" in md.stdout
    assert md.stdout.count("\n| `") == len(rows)


def test_compare_names_the_settings_that_differ_and_the_dashboard_shows_changed_ones():
    from diagtrain.dashboard.overview import settings_text
    from diagtrain.profiler.compare.regression import settings_notes

    base = [{"settings": {"straggler.min_excess_ms": 5.0, "straggler.min_steps": 2}}]
    assert settings_notes(base, {"settings": {"straggler.min_excess_ms": 5.0, "straggler.min_steps": 2}}) == []
    [note] = settings_notes(base, {"settings": {"straggler.min_excess_ms": 250.0, "straggler.min_steps": 2}})
    assert "straggler.min_excess_ms 5.0 → 250.0" in note and "min_steps" not in note
    assert settings_notes([{"settings": None}], {"settings": {"straggler.min_steps": 3}}) == []  # an older report

    assert settings_text({"settings": {"values": {}, "overridden": {}}}) == "defaults"
    assert settings_text({"settings": {"overridden": {"straggler.min_excess_ms": 250.0}}}) == \
        "changed: straggler.min_excess_ms=250.0"
    assert settings_text({}).startswith("not recorded")

