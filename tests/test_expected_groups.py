"""Which collectives the model's check judges against the layout (judge/model_check/expected.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.model_check.expected import UNNAMED, _modeled


def test_a_call_that_lost_its_group_among_named_ones_is_no_communication_the_layout_lacks():
    # An 8-rank 3D job's rank 0 once traced one all-gather of its mesh_dp group without the group's name: judged
    # as a group the layout lacks, it was an "unexpected communication" warning. Among named calls it is skipped;
    # in a run whose traces name no group at all, unnamed calls are the run's and are judged.
    assert _modeled("mesh_dp", True) and _modeled("default_pg", True)
    assert not any(_modeled(name, True) for name in UNNAMED)
    assert all(_modeled(name, False) for name in UNNAMED)
    assert not _modeled("my_custom_group", True) and not _modeled("my_custom_group", False)
