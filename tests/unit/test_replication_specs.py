"""Issue 35's fields of Studies 01 and 07: refused before any engine with the field, value and what is allowed;
absent from the run keys at their defaults; one stored run per engine set."""

import pytest

from fp8lab.errors import SpecError
from fp8lab.prefix.spec import PrefixSpec
from fp8lab.serving.spec import ServingPlan
from fp8lab.specs import EngineSpec

TINY = "data/models/fp8lab-tiny-qwen3"
PX = {"model": TINY, "kv_cache_gib": 0.005126953125, "block_size": 32, "max_model_len": 1024}


def plan(**kw):
    return ServingPlan(EngineSpec(model=TINY, kv_cache_gib=0.02, max_model_len=9000), capacity_shape=None, **kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"engines": 0}, r"engines = 0: an integer in \[1, 100\]"),
        ({"arms": ["both"]}, r"arms = \['both'\]: a non-empty list of distinct values of \['colocated', 'solo'\]"),
        ({"trials": 1}, r"trials = 1: an integer in \[3, 1000\]"),
        ({"solo_gpu_memory_utilization": 0}, r"solo_gpu_memory_utilization = 0: "),
    ],
)
def test_bad_replication_fields_are_named(kw, match):
    with pytest.raises(SpecError, match="ServingPlan." + match):
        plan(**kw)
    with pytest.raises(SpecError, match="PrefixSpec." + match.replace("3, 1000", "2, 1000")):
        PrefixSpec(**PX, **kw)


def test_defaults_keep_the_keys_and_each_engine_set_is_its_own_run():
    assert not {"engines", "arms"} & set(plan().to_dict()) and "engines" in plan(engines=2, trials=1).to_dict()
    assert not {"engines", "arms", "engine_set"} & set(PrefixSpec(**PX).descriptor()["spec"])
    spec = PrefixSpec(**PX, engines=2, trials=1, arms=["colocated", "solo"])
    subs = [spec.set_spec(es) for es in spec.schedule()]
    assert [s.kv_dtypes for s in subs][:3] == [("auto", "fp8"), ("auto",), ("fp8",)]
    assert len({str(s.descriptor()["spec"]) for s in subs}) == 6 and subs[1].gpu_memory_utilization == 0.9
