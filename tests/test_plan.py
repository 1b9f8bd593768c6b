"""The planner's cost models against the worked numbers and the literature, and `diagtrain plan`'s input checks."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from diagtrain.profiler.cli import main
from diagtrain.profiler.model.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ring_time
from diagtrain.profiler.model.pipeline import bubble, bubble_with_stage_times, fill, microbatches_for
from diagtrain.profiler.model.precision import MIXED_BF16, bytes_per_parameter
from diagtrain.profiler.plan import comm, model, planner
from diagtrain.profiler.plan.compute import flops_per_token
from diagtrain.profiler.plan.hardware import Cluster, find_gpu, gpu_table
from diagtrain.profiler.plan.layout import TEXTBOOK, Layout
from diagtrain.profiler.plan.memory import Held, activation_elements, held, model_state
from diagtrain.profiler.plan.units import parse_bandwidth, parse_bytes, parse_count

USAGE = 2


# -- the worked numbers ----------------------------------------------------------------


def test_70b_needs_1_12_tb_of_state_and_at_least_14_h100s():
    m = model.shape_for(70e9)
    assert m.params * MIXED_BF16.state_bytes == pytest.approx(1.12e12, rel=1e-9)
    h100 = find_gpu("h100-80gb")
    assert planner.min_gpus_for_state(m.params, h100.memory_bytes, MIXED_BF16) == 14
    assert 13 * h100.memory_bytes < m.params * 16 <= 14 * h100.memory_bytes


def test_ring_all_reduce_of_7b_fp32_gradients_over_8_gpus_at_600_gb_s_takes_82_ms():
    seconds = ring_time(ALL_REDUCE, 7e9 * 4, 8, 600e9)
    assert round(seconds * 1e3) == 82
    assert seconds == pytest.approx(2 * 28e9 / 600e9 * 7 / 8)
    # all-gather and reduce-scatter move half as much: (n-1)/n of the whole buffer.
    assert ring_time(ALL_GATHER, 28e9, 8, 600e9) == pytest.approx(seconds / 2)
    assert ring_time(REDUCE_SCATTER, 28e9, 8, 600e9) == pytest.approx(seconds / 2)


def test_pipeline_bubble_formula():
    assert round(bubble(8, 4) * 100) == 64  # 7/11
    assert bubble(8, 32) == pytest.approx(7 / 39) and round(bubble(8, 32) * 100) == 18
    assert bubble(8, 4, "gpipe") == bubble(8, 4, "1f1b")  # 1F1B saves memory, not idle time
    assert bubble(8, 4, "interleaved", 2) == pytest.approx(7 / 15)
    assert bubble(8, 4, "interleaved", 2) < bubble(8, 4)
    assert bubble(1, 4) == 0.0
    assert microbatches_for(8, 0.2) == 28 and bubble(8, 28) <= 0.2 < bubble(8, 27)


# -- the models against the papers they come from ---------------------------------------------


def test_zero_stages_divide_the_state_as_the_zero_paper_figure_1():
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 data-parallel GPUs, mixed-precision Adam.
    psi, nd = 7.5e9, 64
    h = Held(local=psi, shard=psi / nd)
    per_gpu = [sum(model_state(h, zero, MIXED_BF16).values()) / 1e9 for zero in (0, 1, 2, 3)]
    assert per_gpu == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)
    # The same per parameter: the shared cost model's bytes per parameter by ZeRO stage.
    assert [bytes_per_parameter(MIXED_BF16, zero, nd) * psi / 1e9 for zero in (0, 1, 2, 3)] == pytest.approx(per_gpu)


def test_an_unstated_precision_is_fp32_adam_at_16_bytes_a_parameter():
    # What the analyzer assumes of a run's model state (report text prints it: an int).
    assert bytes_per_parameter() == 16 and isinstance(bytes_per_parameter(), int)


def test_unequal_stages_idle_more_than_the_formula():
    equal = pd.Series([10.0, 10.0, 10.0, 10.0])
    assert bubble_with_stage_times(equal, 8) == pytest.approx(bubble(4, 8))
    assert bubble_with_stage_times(pd.Series([10.0, 10.0, 10.0, 20.0]), 8) > bubble(4, 8)
    assert fill(4) == 3 and fill(4, "interleaved", 3) == 1


def test_tensor_and_pipeline_parallelism_divide_the_layers_they_own():
    m = model.shape_for(13e9)
    whole = held(m, Layout(), 0).local
    assert whole == pytest.approx(13e9)
    # TP-8 cuts every matrix (and the vocabulary) by 8; only the norms stay whole on every rank.
    tp8 = held(m, Layout(tp=8), 0).local
    norms = sum(t.numel for t in m.tensors() if len(t.shape) == 1) * m.scale
    assert tp8 == pytest.approx((whole - norms) / 8 + norms)
    # PP-4: each stage a quarter of the layers; the first holds the embedding, the last the output.
    stages = [held(m, Layout(pp=4), r).local for r in range(4)]
    assert sum(stages) == pytest.approx(whole)
    embedding = m.vocab * m.hidden * m.scale
    assert stages[0] - stages[1] == pytest.approx(embedding, rel=1e-6)


def test_activations_per_layer_match_korthikanti():
    # 34·s·b·h bytes per layer at 2 bytes per element (Korthikanti et al. 2022, eq. 1, fused attention,
    # no dropout masks) for a GPT block; tensor parallelism cuts everything but the norms' tensors.
    gpt = model.Transformer(layers=1, hidden=4096, heads=32, mlp="gelu", norm="layernorm")
    replicated, cut = activation_elements(gpt, tp=1)
    assert 2 * (replicated + cut) == 34 * 4096
    replicated8, cut8 = activation_elements(gpt, tp=8)
    assert replicated8 == replicated and cut8 == pytest.approx(cut / 8)


def test_megatron_tensor_parallel_layer_sends_four_all_reduces_per_microbatch():
    m = model.Transformer(layers=2, hidden=1024, heads=16, seq_len=512, vocab_parallel=False)
    lay = Layout(tp=4, micro_batch=2, grad_accum=3)
    calls = comm.collectives(m, lay, MIXED_BF16, 0, impl=TEXTBOOK)
    assert {c.op for c in calls} == {ALL_REDUCE}
    assert sum(c.calls for c in calls) == 4 * 2 * 3  # (2 forward + 2 backward) x layers x microbatches
    assert all(c.bytes == 2 * 512 * 1024 * 2 for c in calls)  # micro-batch x sequence x hidden, bf16
    checkpointed = comm.collectives(m, Layout(tp=4, micro_batch=2, grad_accum=3, activation_checkpointing=True),
                                    MIXED_BF16, 0)
    assert sum(c.calls for c in checkpointed) == 6 * 2 * 3  # the forward's two run again in backward


def test_compute_is_six_flops_per_parameter_per_token_plus_attention():
    m = model.Transformer(layers=4, hidden=512, heads=8, seq_len=256, vocab=1000, mlp="gelu", norm="layernorm")
    matmul = sum(t.numel for t in m.tensors() if t.name != "tok_embeddings.weight")
    assert flops_per_token(m) == 6 * matmul + 12 * 4 * 256 * 512


# -- the literature's rules of thumb ----------------------------------------------------------


def literature_30b() -> planner.Plan:
    """30B (OPT-30B's shape) on 4 nodes of 8 A100-80GB, NVLink at the 600 GB/s the literature quotes,
    HDR InfiniBand (200 Gb/s per GPU) between nodes; 1024 sequences of 2048 tokens per step."""
    a100 = find_gpu("a100-80gb")
    cluster = Cluster(a100, gpus=32, gpus_per_node=8, intra_node_bw=600e9, inter_node_bw=200e9 / 8)
    m = model.shape_for(30e9)
    assert (m.layers, m.hidden, m.heads, m.seq_len) == (48, 7168, 56, 2048)
    return planner.plan(m, cluster, MIXED_BF16, 1024, 0.4)


def test_30b_on_32_a100s_ranks_fsdp_and_tp8_dp4_among_the_top_layouts():
    p = literature_30b()
    names = [(e.layout.dp, e.layout.tp, e.layout.pp) for e in p.ranked]
    fsdp = names.index((32, 1, 1))
    tp8 = names.index((4, 8, 1))
    assert fsdp < 3 and tp8 < 10, [e.layout.name() for e in p.ranked[:10]]
    assert p.ranked[fsdp].layout.zero == 3
    # Why: FSDP's gathers hide behind compute once the micro-batch is large enough, and it fits.
    assert "data-parallel traffic hides behind compute" in p.ranked[fsdp].why or "As fast as the first" in p.ranked[fsdp].why
    # TP-8 x DP-4 keeps tensor parallelism on NVLink; what it pays is its all-reduces there, a few % of the step.
    e = p.ranked[tp8]
    assert "tensor-parallel all-reduces" in e.why and "nvlink" in e.why
    assert e.step / p.ranked[0].step < 1.10
    assert all(t.collective.link == "nvlink" for t in e.collectives if t.collective.group == "tp")
    # No layout stretches tensor parallelism over the network.
    assert all(e.layout.tp <= 8 for e in p.ranked + p.not_fitting)


def test_a_model_that_fits_one_gpu_gets_ddp():
    a100 = find_gpu("a100-80gb")
    p = planner.plan(model.shape_for(1.3e9), Cluster(a100, 8, 8, a100.intra_node_bw, a100.network_bw),
                     MIXED_BF16, 512, 0.4)
    best = p.ranked[0].layout
    assert (best.dp, best.tp, best.pp, best.zero) == (8, 1, 1, 0)
    assert p.ranked[0].why.startswith("Fastest")


def test_nothing_fits_says_what_would():
    h100 = find_gpu("h100-80gb")
    p = planner.plan(model.shape_for(70e9), Cluster(h100, 8, 8, h100.intra_node_bw, h100.network_bw),
                     MIXED_BF16, 64, 0.4)
    assert p.ranked == []
    text = " ".join(p.advice)
    assert "at least 14 GPUs" in text
    assert "With 16 GPUs" in text or "With 32 GPUs" in text


def test_the_gpu_table_has_sources_and_plausible_numbers():
    table = gpu_table()
    assert {"a100-80gb", "h100-80gb", "h200-141gb", "mi300x-192gb"} <= set(table)
    for gpu in table.values():
        assert gpu.sources and all(s.startswith("https://") for s in gpu.sources)
        assert 16e9 <= gpu.memory_bytes <= 300e9 and 1e14 <= gpu.peak_flops <= 5e15
    assert table["h100-80gb"].peak_flops == 989e12 and table["a100-80gb"].memory_bytes == 80e9


def test_units():
    assert parse_count("70B") == 70e9 and parse_count("350m") == 350e6 and parse_count("7e9") == 7e9
    assert parse_bytes("80GB") == 80e9 and parse_bytes("96GiB") == 96 * 2**30
    assert parse_bandwidth("900GB/s") == 900e9 and parse_bandwidth("400Gb/s") == 50e9
    for bad, parse in (("-3B", parse_count), ("seventy", parse_count), ("400", parse_bandwidth)):
        with pytest.raises(ValueError):
            parse(bad)


# -- the command line ----------------------------------------------------------------------------


def test_plan_markdown_and_json(capsys):
    assert main(["plan", "--params", "70B", "--gpus", "32", "--gpu", "h100-80gb", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "1.12 TB" in text and "at least 14 of these GPUs" in text
    assert "| 1 |" in text and "| 4 |" not in text and "Memory per GPU" in text and "| tp (x" in text
    assert main(["plan", "--params", "7B", "--gpus", "8", "--gpu", "h100", "--format", "json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state_bytes"] == pytest.approx(7e9 * 16) and doc["min_gpus_for_state"] == 2
    first = doc["ranked"][0]
    assert first["fits"] and first["memory_bytes"]["total"] <= first["usable_bytes"]
    assert math.isclose(sum(first["components_s"].values()), first["step_s"])
    assert {c["link"] for c in first["collectives"]} <= {"nvlink", "network"}


@pytest.mark.parametrize("args,message", [
    (["--gpus", "8"], "give --params N"),
    (["--params", "70B"], "--gpus is required"),
    (["--params=-70B", "--gpus", "8"], "--params '-70B'"),
    (["--params", "70B", "--gpus", "8", "--gpu", "z100"], "unknown GPU 'z100'; known:"),
    (["--params", "70B", "--gpus", "12", "--gpus-per-node", "8"], "does not fill nodes of 8"),
    (["--params", "70B", "--gpus", "64", "--tp", "3"], "does not divide 64 GPUs"),
    (["--params", "70B", "--gpus", "64", "--tp", "16"], "spans more than a node"),
    (["--params", "70B", "--gpus", "0"], "--gpus must be at least 1"),
    (["--params", "7B", "--gpus", "8", "--hidden", "1000", "--heads", "3"], "not divisible by --heads"),
    (["--params", "7B", "--gpus", "8", "--layers", "-2"], "--layers must be at least 1"),
    (["--params", "7B", "--gpus", "8", "--peak-fraction", "1.5"], "--peak-fraction"),
    (["--params", "7B", "--gpus", "8", "--inter-node-bw", "fast"], "--inter-node-bw"),
    (["--params", "7B", "--from", "x"], "exclude each other"),
    (["--from", "/nonexistent/run"], "no such run directory"),
])
def test_bad_input_is_a_usage_error(capsys, args, message):
    assert main(["plan", *args]) == USAGE
    err = capsys.readouterr().err
    assert "diagtrain plan: error:" in err and message in err
