"""scripts/scoring_check.py takes the model as a user gives it: the real model's name (``smollm2-135m-instruct``)
resolves to its converted folder before the tokenizer is read, as in the studies (:func:`fp8lab.specs.resolve_model`)."""

from __future__ import annotations

import importlib.util

import huggingface_hub.constants
import pytest

from fp8lab.paths import REPO_ROOT, TINY_MODEL_DIR
from fp8lab.quality import ppl_windows

spec = importlib.util.spec_from_file_location("scoring_check", REPO_ROOT / "scripts" / "scoring_check.py")
scoring_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scoring_check)


def test_the_real_models_name_gives_its_own_tokenizers_windows(real_model, monkeypatch):
    wins = scoring_check.held_out_windows("smollm2-135m-instruct", 2, 48)
    assert wins == ppl_windows(real_model, 2, 48)
    assert [len(w) for w in wins] == [48, 48]
    # another tokenizer cuts the same text into other ids: the alias did not fall back to the shipped model
    assert wins != ppl_windows(str(TINY_MODEL_DIR), 2, 48)
    # the raw alias, as the script passed it before: a hub id transformers cannot find. Offline, so the answer is the
    # same without the hub client's retries against an unreachable network (about 45 s of back-off here)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError):
        ppl_windows("smollm2-135m-instruct", 2, 48)
