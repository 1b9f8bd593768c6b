"""Was the machine the same? What a run's manifest and telemetry say about where and beside what it ran.

A run's facts (hosts, versions, GPUs, how busy the host was with other processes, GPU throttling)
are stored in its summary; :func:`check` says in words how NEW's differ from the baseline runs'.
A time that changed while NEW ran on another machine, or beside more competing processes, is
machine noise until shown otherwise: the gate reports it as inconclusive, never as a regression. A
baseline run beside more load than NEW hides a slower NEW just as surely: a time that did not regress
then is inconclusive too, never "unchanged".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.compare.thresholds import CompareSettings

VERSION_KEYS = ("torch", "cuda", "nccl", "driver", "python")
# Other processes using this many more CPUs (cores) during NEW than during the busiest baseline
# run: half a core taken from ranks that each want a whole one slows them by a visible factor.
MORE_CONTENDED_CPUS = 0.5
# compare.more_runq_share: 10% of every step lost to waiting for a CPU is beyond what a clean run of one
# job shows between runs of similar load (0.27-0.57 beside two CPU hogs, one run at 0.71).
NAMED = 3  # the busiest other processes named in words


@dataclass
class MachineCheck:
    """How NEW's machine differed from the baseline's; each field a sentence or empty."""

    different: list[str] = field(default_factory=list)  # another machine: hardware, host, telemetry source
    contention: list[str] = field(default_factory=list)  # NEW ran beside more load, or throttled
    loaded_base: list[str] = field(default_factory=list)  # a BASE run ran beside more load than NEW, or throttled
    notes: list[str] = field(default_factory=list)  # told, not judged (versions: may be the change under test)

    @property
    def same(self) -> bool:
        """Whether a time that changed can be put down to the code (no machine or load difference)."""
        return not self.different and not self.contention and not self.loaded_base


def facts(run: Path, steps: pd.DataFrame) -> dict[str, Any]:
    """The machine facts of an analyzed run, over the time of ``steps`` (its compared steps)."""
    manifest = _manifest(run)
    hosts = manifest.get("hosts") or []
    telemetry = _telemetry(run)
    span = (float(steps["start"].min()), float(steps["end"].max())) if {"start", "end"} <= set(steps.columns) else None
    window = telemetry if telemetry.empty or span is None or "unix" not in telemetry else \
        telemetry[telemetry["unix"].between(*span)]
    return {
        "hosts": sorted(str(h.get("name") or h.get("hostname")) for h in hosts),
        "versions": {k: (manifest.get("versions") or {}).get(k) for k in VERSION_KEYS},
        "telemetry_source": sorted({str(h.get("telemetry_source")) for h in hosts if h.get("telemetry_source")}),
        "gpus": int(window.loc[window["kind"] == "gpu", "device"].nunique()) if "device" in window else 0,
        "contention": _contention(window, steps),
    }


def _contention(t: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """CPUs used by other processes (mean), the busiest of them, GPU throttling, and the ranks' wait for a
    CPU (median over ranks of their median per step, in ms and as a share of the step)."""
    out: dict[str, Any] = {"others_cpus": None, "others": [], "throttled_share": None, "runq_share": None,
                           "runq_ms": None}
    if {"runq_ms", "wall_ms"} <= set(steps.columns) and steps["runq_ms"].notna().any():
        per_rank = steps.dropna(subset=["runq_ms"]).groupby("rank")
        out["runq_share"] = round(float((per_rank["runq_ms"].median() / per_rank["wall_ms"].median()).median()), 4)
        out["runq_ms"] = round(float(per_rank["runq_ms"].median().median()), 3)
    if t.empty or "kind" not in t:
        return out
    if "others_cpu_percent" in t:
        host = t[(t["kind"] == "host") & t["others_cpu_percent"].notna()]
        if len(host):
            out["others_cpus"] = round(float(host["others_cpu_percent"].mean()) / 100, 2)  # CPUs taken, on average
    others = t[t["kind"] == "other"]
    if len(others) and "name" in others:
        busiest = others.groupby("name")["cpu_percent"].sum().sort_values(ascending=False).head(NAMED)
        out["others"] = [str(n) for n in busiest.index]
    if "throttled" in t:
        gpu = t[(t["kind"] == "gpu") & t["throttled"].notna()]
        if len(gpu):
            out["throttled_share"] = round(float(gpu["throttled"].astype(bool).mean()), 3)
    return out


def check(base: list[dict[str, Any]], new: dict[str, Any], same_hosts: bool = False) -> MachineCheck:
    """How NEW's machine facts differ from the baseline runs' (summaries without facts are taken as same).

    ``same_hosts``: the user vouches that differently named hosts are the same hardware (CI runners).
    """
    result = MachineCheck()
    known = [b["machine"] for b in base if b.get("machine")]
    theirs = new.get("machine")
    if not known or not theirs:
        return result
    for key, label in (("hosts", "host"), ("telemetry_source", "telemetry"), ("gpus", "GPUs"))[same_hosts:]:
        seen = {json.dumps(m.get(key)) for m in known}
        if json.dumps(theirs.get(key)) not in seen:
            result.different.append(f"NEW ran on {label} {_said(theirs.get(key))}, BASE on "
                                    f"{' / '.join(_said(json.loads(s)) for s in sorted(seen))}")
    for key in VERSION_KEYS:
        seen = {m["versions"].get(key) for m in known if m.get("versions")}
        mine = (theirs.get("versions") or {}).get(key)
        if seen and mine not in seen:
            result.notes.append(f"NEW ran {key} {mine}, BASE {' / '.join(map(str, sorted(seen, key=str)))}")
    mine = theirs.get("contention") or {}
    result.contention = _more_contended([m.get("contention") or {} for m in known], mine)
    for i, m in enumerate(known):
        label = f"BASE run {i + 1}" if len(known) > 1 else "BASE"
        result.loaded_base += _more_contended([mine], m.get("contention") or {}, label, "NEW")
    return result


def _more_contended(others: list[dict[str, Any]], loaded: dict[str, Any], who: str = "NEW",
                    than: str = "BASE") -> list[str]:
    """Sentences on how ``loaded`` (``who``'s facts) ran beside more load than every one of ``others`` (``than``)."""
    said = []
    waited = max((c["runq_share"] for c in others if c.get("runq_share") is not None), default=None)
    share = loaded.get("runq_share")
    if waited is not None and share is not None and share >= waited + CompareSettings.active().more_runq_share:
        said.append(f"{who}'s ranks waited for a CPU {share:.0%} of each step ({loaded.get('runq_ms') or 0:.0f} ms), "
                    f"{than}'s at most {waited:.0%}")
    busiest = max((c["others_cpus"] for c in others if c.get("others_cpus") is not None), default=None)
    mine = loaded.get("others_cpus")
    if busiest is not None and mine is not None and mine >= busiest + MORE_CONTENDED_CPUS:
        names = f" ({', '.join(loaded['others'])})" if loaded.get("others") else ""
        said.append(f"{who} ran with {mine:.1f} other CPUs busy on the host{names}; {than} with at most {busiest:.1f}")
    throttled = max((c["throttled_share"] for c in others if c.get("throttled_share") is not None), default=None)
    slowed = loaded.get("throttled_share")
    if throttled is not None and slowed is not None and slowed >= throttled + CompareSettings.active().more_throttled_share:
        said.append(f"{who}'s GPUs were throttled in {slowed:.0%} of the samples, {than}'s in at most {throttled:.0%}")
    return said


def _said(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none recorded"
    return str(value)


def _manifest(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}  # a copied analysis without its manifest: no facts, nothing judged on them


def _telemetry(run: Path) -> pd.DataFrame:
    path = run / "analysis" / "telemetry.parquet"
    try:
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()
    except (OSError, ValueError):
        return pd.DataFrame()

