import pytest

from diagtrain.reference_trainers.config import ConfigError, TrainConfig, validate
from diagtrain.reference_trainers.fault_specs import parse_fault


def test_parse_keeps_rank_step_and_params_apart():
    f = parse_fault("straggler:rank=1,ms=50,steps=3-5")
    assert (f.kind, f.rank, f.step) == ("straggler", 1, None)
    assert f.params == {"ms": 50.0, "steps": "3-5"}
    assert f.active(3) and f.active(5) and not f.active(2) and not f.active(6)
    assert f.to_json() == {"kind": "straggler", "rank": 1, "step": None, "params": {"ms": 50.0, "steps": "3-5"}}
    h = parse_fault("hang:rank=2,step=7")
    assert (h.rank, h.step, h.params) == (2, 7, {})


@pytest.mark.parametrize("text,why", [
    ("nope:rank=1", "unknown fault kind"),
    ("straggler:rank=1", "exactly one of ms or factor"),
    ("straggler:rank=1,ms=5,factor=2", "exactly one of ms or factor"),
    ("straggler:rank=x,ms=5", "not an integer"),
    ("straggler:rank=1,ms=5,color=red", "not 'color'"),
    ("straggler:rank=1,ms", "not key=value"),
    ("straggler:rank=1,factor=0.5", "out of range"),
    ("hang:rank=1", "exactly one of step"),
])
def test_bad_specs_are_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why):
        parse_fault(text)


def _config(**kw) -> TrainConfig:
    base = dict(strategy="pp", nproc=2, steps=4)
    return TrainConfig(**{**base, **kw})


def test_pp_imbalance_moves_layers_to_the_named_stage():
    c = _config(layers=6, inject=[parse_fault("pp_imbalance:stage=0,layers=5")])
    assert c.stage_layers() == [5, 1]
    assert _config(layers=6).stage_layers() == [3, 3]


def test_faults_are_checked_against_the_run():
    with pytest.raises(ConfigError, match="rank 3 is outside 0..1"):
        validate(_config(strategy="ddp", inject=[parse_fault("mem_imbalance:rank=3,mb=1")]))
    with pytest.raises(ConfigError, match="step 9 is outside 1..4"):
        validate(_config(inject=[parse_fault("hang:rank=0,step=9")]))
    with pytest.raises(ConfigError, match="needs a pipeline"):
        validate(_config(strategy="fsdp", inject=[parse_fault("few_microbatches:microbatches=1")]))
    with pytest.raises(ConfigError, match="not fewer than"):
        validate(_config(schedule="gpipe", inject=[parse_fault("few_microbatches:microbatches=2")]))
    with pytest.raises(ConfigError, match="cannot fill"):
        validate(_config(layers=4, inject=[parse_fault("pp_imbalance:stage=0,layers=4")]))
