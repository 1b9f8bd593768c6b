"""Shared by the benchmarks: where results go and what machine produced them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# For the snippets the benchmarks run in fresh processes: the process's own peak RSS. Not getrusage's
# ru_maxrss, which Linux keeps across fork and exec: a child of a parent holding 1.5 GiB (a trace it
# just wrote) reported 1.5 GiB whatever it used itself. VmHWM is the peak of this address space only.
PEAK_MIB_CODE = """
def peak_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
"""


def machine() -> dict:
    """Date, host facts and versions, recorded with every result."""
    import psutil

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "diagtrain": metadata.version("diagtrain"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        # The host is shared (CI runners, other jobs): a result is read against the load it ran under.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def save(name: str, result: dict, markdown: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md``."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)


def run(cmd: list[str], env: dict | None = None) -> None:
    """Run a command; stop the benchmark with its output if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def live_alarms(run_dir: Path) -> list[str]:
    """The warning-or-worse findings live judgement raised while the job ran ("live KIND [RANKS]"), from
    RUN/live/findings.jsonl: on a clean run each is a false alarm, as a final report's would be."""
    path = run_dir / "live" / "findings.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted({f"live {e['kind']} {e['ranks']}" for e in events
                   if e.get("event") in ("new", "update") and e.get("severity") in ("warning", "error", "critical")})
