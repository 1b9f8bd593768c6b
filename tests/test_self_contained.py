"""Tests and benchmarks read nothing outside the checkout: a user's clone has nothing beside it.

Every Python file under tests/ and benchmarks/ is parsed, and each path it builds from its own place
(``Path(__file__).parents[N]``, ``.parent.parent...``) or names as text (``../x``, an absolute path of
a machine) must stay inside the repository. Real artifacts from other projects live in
tests/fixtures/public/ with their provenance.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Text that names a place outside any checkout: a folder above it, or a path of the machine it was written on.
OUTSIDE_TEXT = re.compile(r"(^|[\s\"'(=])\.\./|^/work/|^/home/|/shared/traces|/shared/flight")  # not read: the pattern
# A line that names such a path as data, not to read it (a path-traversal attack a test sends, a pattern
# a check looks for), says so with this comment.
ON_PURPOSE = "# not read: "


def _parent_steps(node: ast.AST) -> int | None:
    """How many folders up ``node`` climbs from ``__file__``: ``Path(__file__)...parents[N]`` or ``.parent`` chains."""
    steps = 0
    while True:
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parents" and isinstance(node.slice, ast.Constant):
            steps += node.slice.value + 1
            node = node.value.value
        elif isinstance(node, ast.Attribute) and node.attr == "parent":
            steps += 1
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve":
            node = node.func.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                and node.args[0].id == "__file__":
            return steps
        else:
            return None


def outside_paths(source: str, depth: int) -> list[str]:
    """Places in ``source`` (a file ``depth`` folders below the repository root) that point outside it."""
    problems = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if hasattr(node, "lineno") and ON_PURPOSE in lines[node.lineno - 1]:
            continue
        steps = _parent_steps(node) if isinstance(node, (ast.Subscript, ast.Attribute)) else None
        if steps is not None and steps > depth + 1:  # the first step is from the file to its folder
            problems.append(f"line {node.lineno}: climbs {steps} steps from a file {depth} folders below the root")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and OUTSIDE_TEXT.search(node.value):
            if not _is_docstring_or_help(node.value):
                problems.append(f"line {node.lineno}: {node.value[:60]!r}")
    return problems


def _is_docstring_or_help(text: str) -> bool:
    # Prose may mention paths ("--before /path/above/..."); a path the code opens is a single token.
    return len(text.split()) > 3


def test_no_test_or_benchmark_reads_outside_the_checkout():
    problems = []
    for path in sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]):
        depth = len(path.relative_to(REPO).parts) - 1
        problems += [f"{path.relative_to(REPO)}: {p}" for p in outside_paths(path.read_text(), depth)]
    assert not problems, "paths outside the repository:\n" + "\n".join(problems)


def test_the_check_catches_each_way_out():
    # The forms earlier tests used to reach a folder beside the checkout, each caught; the same forms inside the checkout pass.
    caught = [
        'T = Path(__file__).resolve().parents[2] / "beside" / "traces"',  # not read: examples of what is caught
        'T = Path(__file__).parent.parent.parent / "beside"',
        'T = Path("../beside/traces/hta/x.json.gz")',  # not read: an example
        'T = open("/work/beside/traces/hta/x.json.gz")',  # not read: an example
    ]
    for source in caught:
        assert outside_paths(source, depth=1), source
    fine = [
        'T = Path(__file__).resolve().parents[1] / "tests" / "fixtures"',
        'T = Path(__file__).parent.parent / "docs"',
        'T = Path(__file__).parent / "fixtures" / "public"',
        '"""Run with --before /path/above/an/older/diagtrain to compare."""',
        'x = "../../etc/passwd"  # not read: a traversal the server must refuse',
    ]
    for source in fine:
        assert outside_paths(source, depth=1) == [], source


def test_no_file_the_repository_does_not_hold_is_cited():
    """A document the code or tests cite (a Markdown file) is in the checkout: a reader who follows it finds it. Names of
    files the analysis writes (report.md) and benchmarks write into their own folders are outputs, not citations."""
    outputs = {"report.md", "PROVENANCE.md"}
    have = {p.name for p in REPO.rglob("*.md") if not {".git", "site", "build"} & set(p.parts)}
    cited = {(name, str(path.relative_to(REPO))) for folder in ("profiler", "api", "dashboard", "benchmarks", "tests",
                                                                 "reference_trainers")
             for path in (REPO / folder).rglob("*.py") for name in re.findall(r"[\w./-]+\.md\b", path.read_text())}
    missing = sorted((name, where) for name, where in cited if Path(name).name not in have | outputs)
    assert not missing, f"cited but not in the repository: {missing}"
