"""fp8lab.scoring: the request builders, Request.forced_token_ids validation, the sequence alignment of both
methods' records and the cache check (hand-computed expectations)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8lab.errors import SpecError
from fp8lab.scoring import cache_check, forced_request, one_pass_request, sequence_logprobs
from fp8lab.specs import Request


def test_forced_request_scores_the_continuation_after_the_context():
    r = forced_request([5, 6, 7], np.array([8, 9]), top_k=3, cls="c", tag="t")
    assert r.prompt_token_ids == (5, 6, 7)
    assert r.forced_token_ids == (8, 9) and r.max_tokens == 2 and r.logprobs == 3
    assert r.prompt_logprobs is None and r.temperature == 0.0 and not r.stop_at_eos


def test_one_pass_request_scores_context_and_continuation_in_one_prompt():
    r = one_pass_request([5, 6, 7], [8, 9], top_k=2)
    assert r.prompt_token_ids == (5, 6, 7, 8, 9) and r.prompt_logprobs == 2 and r.max_tokens == 1
    assert r.forced_token_ids is None


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(forced_token_ids=(), max_tokens=1, logprobs=0), "forced_token_ids"),
        (dict(forced_token_ids=(1, -2), max_tokens=2, logprobs=0), "forced_token_ids"),
        (dict(forced_token_ids=(1, 2.5), max_tokens=2, logprobs=0), "forced_token_ids"),
        (dict(forced_token_ids="12", max_tokens=2, logprobs=0), "forced_token_ids"),
        (dict(forced_token_ids=(1, 2), max_tokens=3, logprobs=0), "max_tokens"),
        (dict(forced_token_ids=(1, 2), max_tokens=2, logprobs=0, stop_at_eos=True), "stop_at_eos"),
        (dict(forced_token_ids=(1, 2), max_tokens=2, logprobs=0, temperature=1.0), "temperature"),
        (dict(forced_token_ids=(1, 2), max_tokens=2), "logprobs"),
    ],
)
def test_bad_forced_requests_name_the_field(kw, field):
    with pytest.raises(SpecError) as e:
        Request(prompt_token_ids=(1,), **kw)
    assert e.value.field == field


def test_forced_ids_accept_numpy_ints_and_become_a_tuple():
    r = Request(prompt_token_ids=(1,), max_tokens=2, logprobs=0, forced_token_ids=np.array([3, 4]))
    assert r.forced_token_ids == (3, 4) and all(type(t) is int for t in r.forced_token_ids)


def _forced_row(ok=True):
    return {
        "prompt_tokens": 3,
        "forced_token_ids": [8, 9],
        "forced_ok": ok,
        "output_token_logprobs": [-0.5, -1.5],
        "output_topk_ids": [[8, 1], [2, 9]],
        "output_topk_logprobs": [[-0.5, -2.0], [-1.0, -1.5]],
        "prompt_token_logprobs": float("nan"),  # a mixed records frame holds NaN for a forced row
    }


def test_sequence_logprobs_aligns_a_forced_record_after_its_prompt():
    lps, ids, tlps = sequence_logprobs(_forced_row())
    assert len(lps) == len(ids) == len(tlps) == 5
    assert all(math.isnan(x) for x in lps[:3]) and lps[3:] == [-0.5, -1.5]
    assert ids[:3] == [[], [], []] and ids[3:] == [[8, 1], [2, 9]] and tlps[4] == [-1.0, -1.5]


def test_a_forced_record_whose_engine_ignored_the_forcing_scores_nothing():
    lps, _, _ = sequence_logprobs(_forced_row(ok=False))
    assert len(lps) == 5 and all(math.isnan(x) for x in lps)


def test_sequence_logprobs_of_a_one_pass_record_are_its_prompt_logprobs():
    row = {
        "prompt_tokens": 3,
        "prompt_token_logprobs": [float("nan"), -1.0, -2.0],
        "prompt_topk_ids": [[], [4], [5]],
        "prompt_topk_logprobs": [[], [-1.0], [-0.1]],
        "forced_token_ids": float("nan"),
    }
    lps, ids, tlps = sequence_logprobs(row)
    assert math.isnan(lps[0]) and lps[1:] == [-1.0, -2.0] and ids == [[], [4], [5]] and tlps[2] == [-0.1]


def test_cache_check_counts_only_positions_both_scored():
    c = cache_check([np.nan, -1.0, -2.0, -3.0, np.nan], [np.nan, -1.0, -2.5, -2.0, -4.0])
    assert c["positions"] == 3
    assert c["max_abs_dlogprob"] == pytest.approx(1.0) and c["mean_abs_dlogprob"] == pytest.approx(0.5)
    assert c["frac_differ"] == pytest.approx(2 / 3)


def test_cache_check_of_identical_scores_is_zero_and_of_nothing_is_nan():
    assert cache_check([-1.0, -2.0], [-1.0, -2.0]) == {
        "positions": 2,
        "max_abs_dlogprob": 0.0,
        "mean_abs_dlogprob": 0.0,
        "frac_differ": 0.0,
    }
    assert cache_check([np.nan], [-1.0])["positions"] == 0


def test_a_slimmed_forced_record_keeps_its_scores_and_whatever_lists_remain():
    row = {**_forced_row(), "output_topk_logprobs": None}  # scripts/slim_store.py nulls task_tf's top-k logprobs
    lps, ids, tlps = sequence_logprobs(row)
    assert lps[3:] == [-0.5, -1.5] and ids[3:] == [[8, 1], [2, 9]] and tlps[3:] == [[], []]
