"""The machines a layout runs on: the GPU table (gpus.json, with its sources) and a cluster of nodes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).with_name("gpus.json")
# Vendors quote NVLink both directions together; a ring sends over each link one way, so its bus
# bandwidth is at most half the quoted figure (A100: 300 of 600 GB/s; nccl-tests reach ~80% of that).
RING_SHARE_OF_QUOTED_LINK = 0.5
NVLINK, NETWORK = "nvlink", "network"  # link classes: inside a node, between nodes


@dataclass(frozen=True)
class Gpu:
    """One accelerator's memory, dense BF16 peak and links, as its vendor states them."""

    key: str
    name: str
    memory_bytes: float
    peak_flops: float  # dense BF16, per second
    intra_node_bw: float  # bytes/s a ring gets inside a node: half the quoted NVLink (or PCIe) figure
    network_bw: float  # bytes/s per GPU, the reference system's NIC
    gpus_per_node: int
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cluster:
    """``gpus`` devices, ``gpus_per_node`` per node, with the bandwidth of each link class (bytes/s)."""

    gpu: Gpu
    gpus: int
    gpus_per_node: int
    intra_node_bw: float
    inter_node_bw: float

    def link(self, group_size: int, stride: int) -> str:
        """The slowest link a ring of ``group_size`` ranks, ``stride`` apart in rank order, crosses."""
        return NVLINK if group_size * stride <= self.gpus_per_node or group_size == 1 else NETWORK


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, Gpu]:
    """Every GPU in gpus.json, by key."""
    doc = json.loads(TABLE.read_text())
    return {key: Gpu(key=key, name=g["name"], memory_bytes=g["memory_gb"] * 1e9, peak_flops=g["bf16_tflops"] * 1e12,
                     intra_node_bw=g["nvlink_gbps"] * 1e9 * RING_SHARE_OF_QUOTED_LINK, network_bw=g["network_gbit"] * 1e9 / 8,
                     gpus_per_node=int(g["gpus_per_node"]), sources=tuple(g["sources"]))
            for key, g in doc["gpus"].items()}


def find_gpu(name: str) -> Gpu:
    """The GPU called ``name`` (its key or an alias, any case); ValueError naming the known ones."""
    wanted = name.strip().lower().replace("_", "-").replace(" ", "-")
    doc = json.loads(TABLE.read_text())["gpus"]
    for key, entry in doc.items():
        if wanted == key or wanted in entry.get("aliases", []):
            return gpu_table()[key]
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(doc))}")
