"""manifest.json: what ran, where, how it ended. Merged from every host's host.json.

Each `diagtrain run` (one per host, or per torchrun agent) writes ``hosts/<name>/host.json`` and
then rebuilds ``manifest.json`` from all hosts and ranks, so the last one to finish leaves the
complete picture, and a half-finished run still has a readable manifest. A host whose wrapper
vanished without ending its record shows as ``abandoned``.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from diagtrain.profiler.run_dir import (
    ANALYSIS_CLAIM,
    HOST_RECORD,
    HOSTS_DIR,
    SCHEMA_VERSION,
    RankIndex,
    holds_run,
    read_hosts,
    read_json,
    run_status,
    write_json_atomic,
)
from diagtrain.profiler.util import processes

# Environment variables worth keeping with a run: they change how collectives and threads behave.
ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "CUDA_", "OMP_", "MASTER_", "PYTORCH_", "GLOO_")


def join(run_dir: Path, hostname: str) -> tuple[Path, list[str]]:
    """This wrapper's folder in the run, and the hosts already running in it (empty for a new run).

    Every host of a multi-host job runs its own `diagtrain run --out DIR`; the second and later
    ones join the run the first one started. This is where a wrapper finds out which it is.
    """
    running = [h["name"] for h in read_hosts(run_dir) if h.get("status") == "running"]
    return claim_host_dir(run_dir, hostname), running


def claim_host_dir(run_dir: Path, hostname: str) -> Path:
    """Create ``hosts/<hostname>`` for this wrapper, or ``<hostname>-2``... if another has it."""
    hosts = run_dir / HOSTS_DIR
    hosts.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = hosts / (hostname if n == 1 else f"{hostname}-{n}")
        try:
            path.mkdir()  # atomic: two agents on one machine never get the same folder
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{hosts}: no free host folder")


# Room kept on the run's filesystem from the start, freed just before the last records are written,
# so that a disk the job filled up still takes host.json and manifest.json (of ~1,500 ranks).
RESERVE_BYTES = 256 << 10


def reserve_space(host_dir: Path) -> Path | None:
    """Write a placeholder of RESERVE_BYTES in ``host_dir``; None where even that does not fit."""
    path = host_dir / ".reserved-space"
    try:
        with open(path, "wb") as f:
            f.write(bytes(RESERVE_BYTES))
            f.flush()
            os.fsync(f.fileno())  # the blocks are allocated now, not when the disk is full
        return path
    except OSError:
        try:
            path.unlink()
        except OSError:
            pass
        return None


def selected_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment variables that matter for distributed training."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def host_record(host_dir: Path, command: list[str], argv: list[str], started_at: float,
                env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The fields of host.json known when the command starts; ``env``: the environment the command runs with."""
    return {
        "name": host_dir.name,
        "hostname": socket.gethostname(),
        "command": command,
        "argv": argv,
        "env": selected_env(env),
        "started_at": started_at,
        "ended_at": None,
        "status": "running",
        "exit_code": None,
        "process": processes.identity(),  # whether this wrapper still runs, for readers on this machine
        "cpus": usable_cpus(),  # the analyzer bounds what removing a sleeping rank saves on a full host (run/ledger.py)
        "python": platform.python_version(),
        "diagtrain": _version("diagtrain"),
    }


def usable_cpus() -> int:
    """The CPUs this wrapper, and the ranks it starts, may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on macOS
        return os.cpu_count() or 1


def occupied_by(run_dir: Path, command: list[str]) -> str | None:
    """Why ``run_dir`` cannot take a run of ``command``, or None when it can.

    It can when it holds no run, or a run still running on other hosts: this wrapper then joins it
    as one more host (several hosts share one --out, and their commands may differ: per-node
    arguments, a wrapper script). It cannot when it holds a finished run, or a run whose wrappers
    are all gone.
    """
    if not holds_run(run_dir):
        return None
    hosts = read_hosts(run_dir)  # a running record whose wrapper is gone reads as abandoned
    manifest = read_json(run_dir / "manifest.json")
    manifest = manifest if isinstance(manifest, dict) else {}
    if any(h.get("status") == "running" for h in hosts):
        return None
    if any(h.get("status") == "abandoned" for h in hosts):
        gone = next(h for h in hosts if h.get("status") == "abandoned")
        return "holds a run whose wrapper is gone (killed before it finished)" + _which(gone)
    if hosts or manifest:
        record = hosts[-1] if hosts else manifest
        return f"already holds a finished run (status {manifest.get('status') or record.get('status')})" + _which(record)
    return "already holds run data (ranks/) from a run without records"


def _which(record: dict[str, Any]) -> str:
    command = record.get("command")
    return f": {' '.join(map(str, command))}" if isinstance(command, list) else ""


def write_host(host_dir: Path, record: dict[str, Any]) -> None:
    write_json_atomic(host_dir / HOST_RECORD, record)


def build(run_dir: Path, gone: list[str] = ()) -> dict[str, Any]:
    """The manifest, from every host.json, rank.json and exit.json in the run directory.

    ``gone``: hosts the caller saw running without a live wrapper (abandoned), beyond those this
    machine can tell by itself.
    """
    hosts = read_hosts(run_dir)
    index = RankIndex(run_dir)
    ranks = index.refresh()
    exits = {r: index.exit_record(r) for r in ranks}
    trainer = read_json(run_dir / "trainer.json")
    first = ranks.get(min(ranks)) if ranks else {}
    for host in hosts:
        if host["status"] == "running" and host["name"] in gone:
            host["status"] = "abandoned"
            host["last_seen"] = (host.get("heartbeat") or {}).get("time") or host.get("started_at")
        host["ranks"] = sorted(index.on_host(host["name"]))
    statuses = [h["status"] for h in hosts]
    return {
        "schema_version": SCHEMA_VERSION,
        "status": run_status(statuses, [(e or {}).get("code") for e in exits.values()]),
        "exit_code": max((h["exit_code"] for h in hosts if h["exit_code"] is not None), key=abs, default=None),
        "world_size": max((i.get("world_size", 1) for i in ranks.values()), default=0),
        "hosts": hosts,
        "command": hosts[0]["command"] if hosts else None,
        "argv": hosts[0]["argv"] if hosts else None,
        "env": hosts[0]["env"] if hosts else {},
        # What of it diagtrain added (NCCL's collective timing, the flight recorder's size): the rest is the user's.
        "env_added": hosts[0].get("env_added", {}) if hosts else {},
        "strategy": trainer["strategy"] if trainer else None,
        "mesh": trainer["mesh"] if trainer else None,
        "injected": read_json(run_dir / "injected.json") or [],
        "exit_codes": {str(r): (e or {}).get("code") for r, e in sorted(exits.items())},
        # diagtrain's own trouble (a profiled window dropped on a full disk, ...): the job was not affected.
        "warnings": [{"host": h["name"], **w} for h in hosts for w in h.get("warnings") or []]
        + _rank_warnings(index, hosts, sorted(ranks)),
        "rank_exits": {str(r): e for r, e in sorted(exits.items())},
        "started_at": min((h["started_at"] for h in hosts), default=None),
        "ended_at": None if "running" in statuses else max((h.get("ended_at") or h.get("last_seen") or 0 for h in hosts),
                                                          default=None),
        "versions": {
            "python": first.get("python"),
            "torch": first.get("torch") or _version("torch"),
            "cuda": first.get("cuda"),
            "nccl": first.get("nccl"),
            "driver": next((h.get("driver") for h in hosts if h.get("driver")), None),
            "diagtrain": _version("diagtrain"),
        },
    }


def _rank_warnings(index: RankIndex, hosts: list[dict[str, Any]], ranks: list[int]) -> list[dict[str, Any]]:
    """Each rank's warnings, from its files and from what its wrapper read on its output, once each."""
    seen_by_wrappers: dict[str, list[dict]] = {}
    for h in hosts:
        for rank, said in (h.get("rank_warnings") or {}).items():
            seen_by_wrappers.setdefault(rank, []).extend(said)
    found = []
    for rank in sorted(set(ranks) | {int(r) for r in seen_by_wrappers if r.isdigit()}):
        messages = {}
        for w in [*index.warnings(rank), *seen_by_wrappers.get(str(rank), [])]:
            messages.setdefault(str(w.get("message")), w)
        found += [{"rank": rank, **w} for w in messages.values()]
    return found


def write(run_dir: Path, gone: list[str] = ()) -> dict[str, Any]:
    """Rebuild manifest.json and return it."""
    manifest = build(run_dir, gone)
    write_json_atomic(run_dir / "manifest.json", manifest)
    return manifest


def claim_analysis(run_dir: Path, host: str) -> bool:
    """True for exactly one of the wrappers that ask (the first): the one that analyzes the run."""
    claim = run_dir / ANALYSIS_CLAIM
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(host + "\n")
    return True


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
