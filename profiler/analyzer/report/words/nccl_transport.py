"""nccl_transport's words (judge/detectors/nccl_transport.py), by case: sockets, the network between a host's GPUs,
NCCL's own warnings."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _listed(f: Facts) -> str:
    return ", ".join(map(str, f["ranks"]))


WORDS = {
    "nccl_transport/sockets": Words(
        lambda f: (f"NCCL on ranks {_listed(f)} sends over NET/Socket (TCP), typically 10-50x slower than "
                   "InfiniBand/RoCE for the same collective."),
        "Check that the IB/RoCE devices are visible in the container (NCCL_DEBUG shows 'NET/IB : No device found'), "
        "that NCCL_IB_DISABLE is not set, and NCCL_SOCKET_IFNAME/NCCL_IB_HCA."),
    "nccl_transport/same_host_network": Words(
        lambda f: (f"GPUs on the same host use the network between them (ranks {_listed(f)}): NCCL did not use P2P "
                   "(NVLink/PCIe) or shared memory."),
        "Check NCCL_P2P_DISABLE / NCCL_SHM_DISABLE, the container's IPC and shared-memory settings (--ipc=host, "
        "/dev/shm size), and the GPU topology (nvidia-smi topo -m)."),
    "nccl_transport/warnings": Words(
        lambda f: f"NCCL printed {f['warnings']} warnings on ranks {_listed(f)}; first: {f['first']}",
        "Read the warnings in ranks/<r>/nccl.log: connection resets and IB completion errors point at a failing link "
        "or host."),
}
