"""The documentation: a README that fits a page, docs/ that stay inside the repository, a findings
reference that covers every kind the analyzer can emit, and settings tables generated from the code."""

from __future__ import annotations

import ast
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diagtrain.profiler.analyzer.judge.kinds import KINDS
from diagtrain.profiler.analyzer.judge.judgement import DETECTORS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_LIMIT = 12 * 1024
# Markdown link targets: [text](target) and <img src="target">.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img[^>]+src=\"([^\"]+)\"")
CLIMB = re.compile(r"(?:\.\./)+[\w./-]*")  # a relative path that climbs: it must stay in the repository
VERBS = ("run", "analyze", "dashboard", "compare", "plan", "train")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def emitted_kinds() -> set[str]:
    """Every ``kind`` a ``Candidate(...)`` in the analyzer's code can take (each string constant of the
    argument: ``"dataloader_stall" if data else "straggler"`` gives both)."""
    kinds: set[str] = set()
    for path in (ROOT / "profiler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Candidate":
                [kind] = [k.value for k in node.keywords if k.arg == "kind"]
                found = {c.value for c in ast.walk(kind) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                assert found, f"{path}:{node.lineno}: a Candidate whose kind is not written in the code; " \
                              "the docs test cannot know it"
                kinds |= found
    return kinds


def test_the_readme_fits_in_12_kb():
    assert (ROOT / "README.md").stat().st_size <= README_LIMIT


def test_no_link_or_path_leads_outside_the_repository():
    problems = []
    for page in pages():
        text = page.read_text()
        targets = [a or b for a, b in LINK.findall(text)] + CLIMB.findall(text)
        for target in targets:
            if target.startswith("#"):
                continue
            if re.match(r"^[a-z]+:", target):  # http:, https:, file:, mailto:
                problems.append(f"{page.relative_to(ROOT)}: {target} (outside the repository)")
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{page.relative_to(ROOT)}: {target} (climbs out of the repository)")
            elif target in [a or b for a, b in LINK.findall(text)] and not resolved.exists():
                problems.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        if "/work/" in text or "shared/DESIGN" in text:  # not read: what a page must not name
            problems.append(f"{page.relative_to(ROOT)}: names a path of the machine it was written on")
    assert not problems, "\n".join(problems)


def test_every_finding_kind_has_its_page_and_every_page_a_kind():
    kinds = {k.name for k in KINDS}
    documented = {p.stem for p in (DOCS / "findings").glob("*.md")} - {"index", "settings"}
    assert kinds - documented == set(), "finding kinds without a page in docs/findings/"
    assert documented - kinds == set(), "pages in docs/findings/ for kinds the analyzer never emits"
    nav = (ROOT / "mkdocs.yml").read_text()
    index = (DOCS / "findings" / "index.md").read_text()
    for kind in KINDS:
        assert f"findings/{kind.name}.md" in nav and f"({kind.name}.md)" in index, kind.name
        page = (ROOT / kind.page).read_text()
        claimed = [m.split() for m in re.findall(r"<!-- settings: ([a-z_ ]+) -->", page)]
        assert claimed == ([list(kind.settings)] if kind.settings else []), f"{kind.page}: settings are not {kind.settings}"


def test_the_architecture_tour_names_every_folder_of_the_tree_and_every_file_it_names_exists():
    """docs/contributing/architecture.md's layout: every package folder of the repository and of the analyzer, and
    every path it quotes, there (a module or folder under profiler/, profiler/analyzer/ or the root)."""
    text = (DOCS / "contributing" / "architecture.md").read_text()
    quoted = set(re.findall(r"`([\w./-]+(?:\.py|/))`", text))
    packages = {p.parent for p in ROOT.glob("*/__init__.py")} | {p.parent for p in ROOT.glob("profiler/*/__init__.py")} \
        | {p.parent for p in ROOT.glob("profiler/analyzer/*/__init__.py")}
    for folder in packages - {ROOT / "profiler"}:  # the tour names profiler/'s folders, one by one
        name = folder.relative_to(ROOT).as_posix() + "/"
        assert name in quoted or f"{folder.name}/" in quoted, f"architecture.md does not name {name}"
    # A path is quoted from the root, from profiler/, or from the analyzer's folder it is spoken of in.
    bases = [ROOT, ROOT / "profiler", ROOT / "api", ROOT / "profiler" / "analyzer",
             *(p for p in (ROOT / "profiler" / "analyzer").iterdir() if p.is_dir())]
    missing = [q for q in quoted if q != "analysis/" and not any((b / q).exists() for b in bases)]
    assert not missing, f"architecture.md names paths the tree lacks: {missing}"


def test_a_finding_is_made_in_one_place_the_verdict():
    """Detectors, assessments, the model's check and live judgement propose ``Candidate``s; ``verdict.verdict()``
    alone makes a ``Finding`` of one (the notebook reads findings back from report.json, outside the analyzer)."""
    makers = set()
    for path in (ROOT / "profiler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                makers.add(path.relative_to(ROOT).as_posix())
    assert makers == {"profiler/analyzer/judge/verdict.py"}


def test_the_kinds_table_is_the_only_list_of_kinds():
    """Every kind the analyzer's code can make is in judge/kinds.py, and every kind there is made somewhere."""
    made = emitted_kinds()
    assert {"straggler", "hang", "memory_growth", "missing_evidence"} <= made  # the scan sees the detectors
    assert made - {k.name for k in KINDS} == set(), "kinds made in the code but not in judge/kinds.py"
    assert {k.name for k in KINDS} - made == set(), "kinds in judge/kinds.py that no code makes"
    assert DETECTORS == tuple(dict.fromkeys(k.detector for k in KINDS if k.detector not in ("model check", "live")))
    for name in DETECTORS:
        assert (ROOT / "profiler" / "analyzer" / "judge" / "detectors" / f"{name}.py").is_file(), name


# -- the built site --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` of docs/ into a temporary folder."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mkdocs and mkdocs-material are not installed (pip install -e '.[dev]')")
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


@pytest.mark.jobs
def test_every_setting_appears_in_the_generated_tables(site):
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", "--settings", "json"],
                          capture_output=True, text=True, timeout=120)
    rows = json.loads(proc.stdout)
    built = "".join(p.read_text() for p in (site / "findings").rglob("index.html"))
    missing = [r["key"] for r in rows if f"<code>{html.escape(r['key'])}</code>" not in built]
    assert rows and not missing, f"settings in no findings page: {missing}"
    sources = "".join(p.read_text() for p in (DOCS / "findings").glob("*.md"))
    assert "| `straggler.min_excess_ms` |" not in sources  # generated at build time, never typed


@pytest.mark.jobs
def test_each_verb_guide_shows_the_verbs_own_help(site):
    for verb in VERBS:
        text = html.unescape((site / "guide" / verb / "index.html").read_text())
        assert f"usage: diagtrain {verb}" in text, verb
