"""Is a change to the analyzer structural? Analyze fixed sets and compare everything they produce.

A refactor of the analyzer must leave reports (findings, ranks, critical path), tables and spans as
they were. This script analyzes each set (a run directory or a folder of traces, copied first so the
set itself stays untouched) with the code installed now and writes one digest per set: report.json
without what varies by design (times of day, paths, the settings a report used), and every Parquet
table and spans file as sorted rows. `check` compares two digests file by file and names what moved.

    python benchmarks/identical.py record SETS_DIR OUT      # every folder in SETS_DIR is a set
    python benchmarks/identical.py check BEFORE AFTER [--new-keys quantity,cause]
                                                            # exit 1 when anything differs

`--new-keys` names keys a change added on purpose (at any depth of the JSON documents): they are
left out of AFTER before comparing, so that everything that was there before must still be equal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

# Keys that differ between two analyses of the same input by design, at any depth of report.json.
VOLATILE = {"generated_at", "analyzed_at", "path", "run_dir", "out", "analysis_dir", "duration_s", "settings",
            "elapsed_s", "created"}


def _scrub(value):
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _table_text(path: Path) -> str:
    frame = pd.read_parquet(path)
    frame = frame.reindex(sorted(frame.columns), axis=1)
    text = frame.astype(str)
    return text.sort_values(list(text.columns)).to_csv(index=False) if len(text.columns) else ""


def digest(analyzed: Path, out: Path, scratch: str) -> None:
    """Write the comparable content of one analysis (``analyzed`` holds report.json and analysis/); the
    scratch folder's name, which differs per analysis, is written as ``<scratch>``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("report.json", "analysis/findings.json", "analysis/hang.json", "analysis/expected.json",
                 "analysis/nccl.json"):
        if (analyzed / name).exists():
            doc = _scrub(json.loads((analyzed / name).read_text()))
            text = json.dumps(doc, indent=1, sort_keys=True, default=str).replace(scratch, "<scratch>")
            (out / Path(name).name).write_text(text)
    for table in sorted((analyzed / "analysis").rglob("*.parquet")):
        name = "__".join(table.relative_to(analyzed / "analysis").parts)
        (out / (name + ".csv")).write_text(_table_text(table))


def record(sets: Path, out: Path) -> None:
    """Analyze every set in ``sets`` and write its digest under ``out``."""
    for folder in sorted(p for p in sets.iterdir() if p.is_dir()):
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / folder.name
            shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("analysis", "report.*"))
            result = Path(scratch) / "out"
            proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(copy),
                                   "--out", str(result), "--format", "json", "--quiet", "--workers", "1"],
                                  capture_output=True, text=True)
            print(f"{folder.name}: analyze exit {proc.returncode}", flush=True)
            if proc.returncode != 0:
                (out / folder.name).mkdir(parents=True, exist_ok=True)
                (out / folder.name / "FAILED").write_text(proc.stderr[-4000:])
                continue
            digest(result, out / folder.name, scratch)


def _without(text: str, keys: set[str]) -> str:
    def drop(value):
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if k not in keys}
        return [drop(v) for v in value] if isinstance(value, list) else value
    return json.dumps(drop(json.loads(text)), indent=1, sort_keys=True)


def check(before: Path, after: Path, new_keys: set[str] = frozenset()) -> int:
    """Name every file that differs between two digests; 1 when any does."""
    differ = 0
    for old in sorted(before.rglob("*")):
        if old.is_dir():
            continue
        new = after / old.relative_to(before)
        text = new.read_text() if new.exists() else None
        if text is not None and new_keys and new.suffix == ".json":
            text = _without(text, new_keys)
        if text is None or text != old.read_text():
            print(f"differs: {old.relative_to(before)}")
            differ += 1
    for new in sorted(after.rglob("*")):
        if new.is_file() and not (before / new.relative_to(after)).exists():
            print(f"new: {new.relative_to(after)}")
            differ += 1
    print("identical" if not differ else f"{differ} files differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("record")
    r.add_argument("sets", type=Path)
    r.add_argument("out", type=Path)
    c = sub.add_parser("check")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--new-keys", default="", help="keys added on purpose, comma-separated")
    args = parser.parse_args()
    if args.verb == "record":
        record(args.sets, args.out)
    else:
        sys.exit(check(args.before, args.after, {k for k in args.new_keys.split(",") if k}))


if __name__ == "__main__":
    main()
