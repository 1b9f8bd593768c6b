"""manifest.json: what ran, where, how it ended. Merged from every host's host.json.

Each `diagtrain run` (one per host, or per torchrun agent) writes ``hosts/<name>/host.json`` and
then rebuilds ``manifest.json`` from all hosts and ranks, so the last one to finish leaves the
complete picture, and a half-finished run still has a readable manifest.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

from diagtrain.profiler.rank_files import RankIndex, read_json
from diagtrain.profiler.run_dir import SCHEMA_VERSION, write_json_atomic

# Environment variables worth keeping with a run: they change how collectives and threads behave.
ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "CUDA_", "OMP_", "MASTER_", "PYTORCH_", "GLOO_")
# A run's status, most telling first: one interrupted host makes the run interrupted.
STATUS_ORDER = ("running", "interrupted", "hung", "failed", "ok")
# Statuses of a run that did not finish its work: the hang verdict and view apply to these.
STOPPED = ("hung", "failed", "interrupted")


def claim_host_dir(run_dir: Path, hostname: str) -> Path:
    """Create ``hosts/<hostname>`` for this wrapper, or ``<hostname>-2``... if another has it."""
    hosts = run_dir / "hosts"
    hosts.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = hosts / (hostname if n == 1 else f"{hostname}-{n}")
        try:
            path.mkdir()  # atomic: two agents on one machine never get the same folder
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{hosts}: no free host folder")


def selected_env(env: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The environment variables that matter for distributed training."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def host_record(host_dir: Path, command: list[str], argv: list[str], started_at: float) -> dict[str, Any]:
    """The fields of host.json known when the command starts."""
    return {
        "name": host_dir.name,
        "hostname": socket.gethostname(),
        "command": command,
        "argv": argv,
        "env": selected_env(),
        "started_at": started_at,
        "ended_at": None,
        "status": "running",
        "exit_code": None,
        "python": platform.python_version(),
        "diagtrain": _version("diagtrain"),
    }


def write_host(host_dir: Path, record: dict[str, Any]) -> None:
    write_json_atomic(host_dir / "host.json", record)


def build(run_dir: Path) -> dict[str, Any]:
    """The manifest, from every host.json, rank.json and exit.json in the run directory."""
    hosts = [h for p in sorted(run_dir.glob("hosts/*/host.json")) if (h := read_json(p))]
    index = RankIndex(run_dir)
    ranks = index.refresh()
    exits = {r: index.exit_record(r) for r in ranks}
    trainer = read_json(run_dir / "trainer.json")
    first = ranks.get(min(ranks)) if ranks else {}
    statuses = [h["status"] for h in hosts]
    if any(e and e.get("code") not in (0, None) for e in exits.values()) and "ok" in statuses:
        statuses.append("failed")  # a rank failed though its launcher exited 0
    for host in hosts:
        host["ranks"] = sorted(index.on_host(host["name"]))
    return {
        "schema_version": SCHEMA_VERSION,
        "status": min(statuses, key=STATUS_ORDER.index) if statuses else "running",
        "exit_code": max((h["exit_code"] for h in hosts if h["exit_code"] is not None), key=abs, default=None),
        "world_size": max((i.get("world_size", 1) for i in ranks.values()), default=0),
        "hosts": hosts,
        "command": hosts[0]["command"] if hosts else None,
        "argv": hosts[0]["argv"] if hosts else None,
        "env": hosts[0]["env"] if hosts else {},
        "strategy": trainer["strategy"] if trainer else None,
        "mesh": trainer["mesh"] if trainer else None,
        "injected": read_json(run_dir / "injected.json") or [],
        "exit_codes": {str(r): (e or {}).get("code") for r, e in sorted(exits.items())},
        "rank_exits": {str(r): e for r, e in sorted(exits.items())},
        "started_at": min((h["started_at"] for h in hosts), default=None),
        "ended_at": None if "running" in statuses else max((h["ended_at"] or 0 for h in hosts), default=None),
        "versions": {
            "python": first.get("python"),
            "torch": first.get("torch") or _version("torch"),
            "cuda": first.get("cuda"),
            "nccl": first.get("nccl"),
            "driver": next((h.get("driver") for h in hosts if h.get("driver")), None),
            "diagtrain": _version("diagtrain"),
        },
    }


def write(run_dir: Path) -> dict[str, Any]:
    """Rebuild manifest.json and return it."""
    manifest = build(run_dir)
    write_json_atomic(run_dir / "manifest.json", manifest)
    return manifest


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
