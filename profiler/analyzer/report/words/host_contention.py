"""host_contention's words (judge/detectors/host_contention.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.util.text import ranges


def _explanation(f: Facts) -> str:
    said = []
    if f["contended_samples"]:
        named = ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_percent']:.0f}%" for p in f["processes"])
        said.append(f"Other processes on host {f['host']} used {f['others_cpu_percent'] / 100:.1f} CPU cores while the "
                    f"job ran (host CPUs {f['host_cpu_percent']:.0f}% busy in {f['contended_samples']} of "
                    f"{f['samples']} samples)" + (f": {named}." if f["processes"] else "."))
    if f["runq_ms"] is not None and f["runq_share"] is not None:
        said.append(f"Ranks {ranges(f['ranks'])} waited {f['runq_ms']:.1f} ms per step ({f['runq_share']:.0%}) for a CPU.")
    return " ".join(said) + (" Step times and differences between ranks on this host reflect the host's load as much as "
                             "the job; a rank slowed by it is not reported as a straggler.")


WORDS = {"host_contention": Words(
    _explanation,
    "Run on a host of its own, or keep other work off the ranks' cores (taskset, cgroups); compare runs only from "
    "similarly loaded hosts.")}
