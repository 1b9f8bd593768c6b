"""The words of the run against the model of its layout (judge/model_check/expected.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _state_mismatch(f: Facts) -> str:
    off = f["ranks_off"]
    return (f"rank {f['rank']} holds {f['held_parameters']:,} parameters where {f['layout']} should leave it "
            f"{f['expected_parameters']:,.0f} ({off} rank{'s' if off > 1 else ''} differ): the model is not split the "
            "way the run's configuration says.")


WORDS = {
    "state_mismatch": Words(
        _state_mismatch,
        "Check that every module is wrapped (FSDP units, tensor-parallel plan) and that no rank builds parameters the "
        "layout does not assign it."),
    "unexpected_communication": Words(
        lambda f: (f"{f['op']} in the {f['group']} group moves {f['measured_bytes'] / 2**20:.2f} MiB per step over its "
                   f"ranks; the layout ({f['layout']}) needs {f['expected_bytes'] / 2**20:.2f} MiB ({f['ratio']:.2f}x)."),
        "Look for collectives the layout does not need (buffer broadcasts, unused parameters, a gradient sync on every "
        "micro-step) or ones it needs that did not run."),
    "bubble_above_model": Words(
        lambda f: (f"the pipeline idles {f['measured']:.0%} of its forward-backward time; {f['schedule']} with "
                   f"{f['stages']} stages and {f['microbatches']} microbatches explains {f['formula']:.0%} "
                   f"({f['explained']:.0%} with the stages' measured times)."),
        "Look at the pipeline sends and receives on the timeline: slow transfers, or a stage that stops between "
        "microbatches (host syncs, data loading inside the schedule)."),
    "memory_above_model": Words(
        lambda f: (f"rank {f['rank']} peaks at {f['peak_bytes'] / 2**30:.1f} GiB; its layout explains "
                   f"{f['expected_peak_bytes'] / 2**30:.1f} GiB (model state, gathered weights, activations)."),
        "Profile memory (torch.cuda.memory._record_memory_history) for what else stays allocated: caches, tensors kept "
        "across steps, fragmentation."),
    "slow_collective_group": Words(
        lambda f: (f"the {f['group']} group's collectives take {f['measured_ms']:.1f} ms per step; at the best bandwidth "
                   f"the group reached ({f['best_busbw_gbps']:.1f} GB/s) the ring model needs {f['model_ms']:.1f} ms."),
        "Compare the slow calls with the fast ones: message sizes too small to reach bandwidth, contention with other "
        "traffic, or a transport change (see the NCCL logs)."),
}
