"""Study 02's end-to-end part on Study 03's machinery (:mod:`fp8lab.quality`; the import points one way,
calibration -> quality): the quality labels of exported sets, vLLM's dynamic scales as one more engine
(:func:`run_dynamic`) and whether the backend reduces per-head scales to one per layer
(:func:`head_reduction_check`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fp8lab.calibration.scales import ScaleSet
from fp8lab.engine.fp8emu import EMULATED_SUFFIX
from fp8lab.quality.spec import STUDY as QUALITY_STUDY


def fp8_base(qs: Any) -> str | None:
    """The default-scale fp8 row of a quality summary that ran: native ``fp8``, else ``fp8 (emulated)``."""
    for lab in ("fp8", "fp8" + EMULATED_SUFFIX):
        if lab in qs.index and qs.loc[lab, "status"] == "ok":
            return lab
    return None


def quality_label(folder: str | Path) -> str:
    """Study 03's label of an exported scale set (``fp8+<folder name>``, :func:`fp8lab.quality.kv_configs`)."""
    return f"fp8+{Path(folder).name}"


def quality_phases(runs: Any) -> list[Any]:
    """The phases :func:`fp8lab.quality.run_quality` gave each KV config (``runs.phases``; rebuilt with
    ``quality.study_phases`` for runs that predate it), so an extra config sees exactly the same requests."""
    from fp8lab import quality as q

    if getattr(runs, "phases", None):
        return list(runs.phases)
    return q.study_phases(runs.spec, runs.prompts, runs.reference_outputs(), runs.windows, runs.task)


DYNAMIC_LABEL = "fp8+dynamic"


def run_dynamic(runs: Any, study: str = QUALITY_STUDY) -> tuple[Any, dict[str, Any]]:
    """(c) on the engine: fp8 with ``calculate_kv_scales=True`` on Study 03's requests.

    Returns ``(runs with the config added, outcome)``; ``outcome``: ``status`` (the engine's),
    ``offered`` (False when this vLLM rejects the argument: 0.32 raises TypeError), ``error`` and a
    one-line ``text``. The scales vLLM computes stay inside the worker (reading them needs a
    ``collective_rpc`` into the attention layers' ``_k_scale_float``), so only the end-to-end effect is
    measured here; :func:`build_scale_sets` emulates the formula offline."""
    import dataclasses

    from fp8lab import quality as q
    from fp8lab.engine.results import run_cached

    cfg = q.KVConfig(DYNAMIC_LABEL, runs.spec.model, "fp8")
    res = run_cached(runs.spec.engine_spec(cfg).replace(calculate_kv_scales=True), quality_phases(runs), study=study)
    err = res.error or ""
    offered = res.ok or not ("calculate_kv_scales" in err and ("TypeError" in err or "unexpected keyword" in err))
    if res.extra.get("not_started"):  # no native FP8 kernel on this device: whether vLLM offers it is not tested
        offered, text = None, f"not tested: {res.status}: {err[:300]}"
    elif res.ok:
        text = (
            "offered: fp8 with calculate_kv_scales=True ran (scales computed by vLLM, not read back; vLLM 0.26 "
            "computes them once, on the first forward pass, which is its start-up profiling run on dummy "
            "token ids, not on these prompts)"
        )
    elif not offered:
        text = "not offered by this vLLM version (calculate_kv_scales rejected: " + err[:200] + ")"
    else:
        text = f"failed: {res.status}: {err[:300]}"
    new = dataclasses.replace(runs, configs=tuple(runs.configs) + (cfg,), results={**runs.results, cfg.label: res})
    return new, {
        "status": res.status,
        "offered": offered,
        "error": res.error,
        "text": text,
        "run_dir": str(res.run_dir),
    }


def logprob_vectors(runs: Any, label: str, phases: Sequence[str] = ("teacher", "ppl")) -> np.ndarray:
    """Every scored token's logprob a config returned in ``phases`` (requests in tag order; through the KV cache
    or one pass, :func:`fp8lab.scoring.sequence_logprobs`), one flat array."""
    from fp8lab.scoring import sequence_logprobs

    vals: list[float] = []
    for ph in phases:
        rec = runs.records(label, ph)
        for tag in sorted(rec.index) if len(rec) else []:
            vals.extend(sequence_logprobs(rec.loc[tag])[0])
    a = np.asarray(vals, dtype=np.float64)
    return a[np.isfinite(a)]


def head_reduction_check(runs: Any, per_head: ScaleSet, per_head_label: str, per_tensor_label: str) -> dict[str, Any]:
    """Does the backend use per-head scales, or one per layer? ``per_head_label`` ran ``per_head``
    (``attn_head``), ``per_tensor_label`` ran its :meth:`ScaleSet.reduced` twin (one scale per layer,
    the max over heads). If their prompt logprobs are bit-identical although the heads' scales differ,
    the backend silently reduced the per-head scales to the max (the CPU build does: vllm-notes 4).

    Returns ``outcome`` (``reduced to max over heads`` | ``per-head scales applied`` | ``not tested``),
    ``reduced`` (bool or None), ``max_abs_dlogprob`` between the two, ``n_logprobs`` compared,
    ``head_ratio_max`` (largest max/min ratio of scales across the heads of one layer)."""
    ratio = float(
        max(
            (per_head.k.max(axis=1) / per_head.k.min(axis=1)).max(),
            (per_head.v.max(axis=1) / per_head.v.min(axis=1)).max(),
        )
    )
    out: dict[str, Any] = {
        "per_head": per_head_label,
        "per_tensor": per_tensor_label,
        "head_ratio_max": ratio,
        "reduced": None,
        "max_abs_dlogprob": None,
        "n_logprobs": 0,
        "outcome": "not tested",
    }
    ok = set(runs.ok_labels)
    if per_head_label not in ok or per_tensor_label not in ok:
        out["outcome"] = "not tested (an engine did not run)"
        return out
    a, b = logprob_vectors(runs, per_head_label), logprob_vectors(runs, per_tensor_label)
    if len(a) == 0 or len(a) != len(b):
        out["outcome"] = "not tested (no comparable prompt logprobs)"
        return out
    d = float(np.abs(a - b).max())
    out.update(max_abs_dlogprob=d, n_logprobs=int(len(a)))
    if ratio <= 1.0:
        out["outcome"] = "not tested (the heads' scales are equal)"
    elif d == 0.0:
        out.update(reduced=True, outcome="reduced to max over heads")
    else:
        out.update(reduced=False, outcome="per-head scales applied")
    return out
