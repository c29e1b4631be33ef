"""Study 08's tables, computed from a stored run's row records only (no engine).

- :func:`matrix`: one row per matrix row: status, root cause and its class, the attention backend, blocks and tokens
  per GiB against fp8lab's formula, where the scales came from, prefix-cache correctness, decode and quality against
  ``auto``.
- :func:`decode`: decode step time per row and context, with the ratio to ``auto``.
- :func:`layers`: what the engine reported per attention layer (dtype, scales, implementation) for each started row.
"""

from __future__ import annotations

from typing import Any

from fp8lab import kvmath
from fp8lab.dtypes.quality import score
from fp8lab.dtypes.run import MatrixRun, classify
from fp8lab.kvformats import FORMATS

GIB = kvmath.GIB


def _backend(r: dict[str, Any]) -> str | None:
    b = (r.get("engine_facts") or {}).get("attention_backend") or r.get("attention_backend")
    if isinstance(b, list):
        return ", ".join(b) if b else None
    return b


def scales_source(r: dict[str, Any]) -> str:
    """Where the row's scales came from, read from the engine's layers (``probe``), not assumed: per-token-head
    formats compute a scale per token and head when written; a per-tensor FP8 cache whose every layer's
    ``k_scale`` / ``v_scale`` is 1.0 runs on the default 1.0, other values came from the checkpoint; packed
    formats (TurboQuant, NVFP4, UltraQuant) keep their scales in the slot; ``auto`` and 16-bit caches have none."""
    probe = r.get("probe") or {}
    lay = probe.get("layers") or []
    if r.get("status") != "started" or not lay:
        return "not read (no engine)" if r.get("status") != "started" else "not read (the engine gave no layers)"
    dts = sorted({x["kv_cache_dtype"] for x in lay})
    quant = [x for x in lay if x["kv_cache_dtype"] not in ("auto", "bfloat16", "float16")]
    kept = len(lay) - len(quant)
    tail = f"; {kept} of {len(lay)} layers kept in the model dtype" if quant and kept else ""
    if not quant:
        return "none (16-bit cache)"
    fmt = FORMATS.get(quant[0]["kv_cache_dtype"])
    if fmt is not None and fmt.rule in ("per_token_head", "int4_per_token_head"):
        return f"per token and head, computed when written (layers' kv_cache_dtype {'/'.join(dts)}){tail}"
    if fmt is not None and fmt.rule == "dense":
        ks = {x["k_scale"] for x in quant} | {x["v_scale"] for x in quant}
        if ks == {1.0}:
            return f"default 1.0 (every layer's k_scale and v_scale){tail}"
        vals = [v for v in ks if v is not None]
        return f"checkpoint (k/v scales {min(vals):.4g}..{max(vals):.4g}){tail}" if vals else "unknown" + tail
    return f"in the packed slot ({fmt.scales if fmt else 'format unknown to fp8lab'}){tail}"


def _predicted(run: MatrixRun, r: dict[str, Any], block_size: int) -> dict[str, Any]:
    s = run.spec
    budget = int(s.kv_cache_gib * GIB)
    try:
        blocks = kvmath.predict_num_blocks(
            s.model, budget, block_size, r["kv_cache_dtype"], s.tensor_parallel_size, skip_layers=r["skip_layers"]
        )
        per_token = kvmath.kv_bytes_per_token(
            s.model, r["kv_cache_dtype"], s.tensor_parallel_size, skip_layers=r["skip_layers"]
        )
    except Exception as exc:  # noqa: BLE001 - a format the calculator has no rule for: said, not guessed
        return {"formula_note": str(exc)}
    return {
        "formula_blocks": blocks,
        "formula_bytes_per_token": per_token,
        "formula_tokens_per_gib": blocks * block_size / s.kv_cache_gib,
    }


def _retry_note(r: dict[str, Any]) -> str | None:
    """What a retry without fp8lab's logits processor (:data:`fp8lab.dtypes.run.V1_RUNNER_BUG`) says beside the row."""
    first = r.get("v1_refusal") or r.get("cuda_graph_refusal")
    if not first:
        return None
    if r.get("without_forcing"):
        return (
            "refused on vLLM's V1 runner (a vLLM bug with TurboQuant; fp8lab's forcing logits processor selects that "
            f"runner), {r.get('status')} without it (V2 runner): no quality scored, decode times not compared"
        )
    return "refused on vLLM's V1 runner (a vLLM bug with TurboQuant), in eager mode too"


def _compared(r: dict[str, Any]) -> bool:
    """Whether the row's decode times compare with auto's (not a retry on another runner or in eager mode)."""
    return not (r.get("without_forcing") or r.get("eager"))


def matrix(run: MatrixRun, scorer: str | None = None) -> Any:
    """The matrix (pandas DataFrame), one row per matrix row in the spec's order."""
    import pandas as pd

    s = run.spec
    mla = kvmath.load_layout(s.model).is_mla
    auto = next((r for r in run.rows if r["label"] == "auto" and r.get("status") == "started"), None)
    auto_steps = {d["context"]: d["step_s"] for d in (auto or {}).get("decode") or []}
    auto_blocks = (auto or {}).get("engine_facts", {}).get("num_blocks")
    auto_bs = (auto or {}).get("engine_facts", {}).get("block_size")
    out = []
    for r in run.rows:
        ef = r.get("engine_facts") or {}
        started = r.get("status") == "started"
        bs = ef.get("block_size") or s.block_size or auto_bs or 16
        row: dict[str, Any] = {
            "label": r["label"],
            "kv_cache_dtype": r["kv_cache_dtype"],
            "skip_layers": ",".join(r.get("skip_layers") or []) or None,
            "status": r.get("status"),
            "cause_class": classify(r.get("status", ""), r.get("cause") or "", r["kv_cache_dtype"], mla),
            "cause": r.get("cause"),
            "checked": r.get("checked") or ("engine start" if r.get("status") != "started" else None),
            "retry": _retry_note(r),
            "phase": r.get("phase") if r.get("status") == "crashed" else None,
            "attention_backend": _backend(r),
            "block_size": bs,
            "num_blocks": ef.get("num_blocks"),
            "tokens_per_gib": ef["num_blocks"] * bs / s.kv_cache_gib if started else None,
        }
        row.update(_predicted(run, r, bs))
        if started:
            row["blocks_exact"] = row.get("formula_blocks") == ef.get("num_blocks")
        if auto_blocks and auto_bs:
            tokens = ef["num_blocks"] * bs if started else row.get("formula_blocks", 0) * bs
            row["capacity_x"] = tokens / (auto_blocks * auto_bs) if tokens else None
            row["capacity_from"] = "engine" if started else "formula"
        row["scales"] = scales_source(r)
        if started and r.get("prefix"):
            p = r["prefix"]
            row["prefix_hit_equals_cold"] = bool(p["tokens_equal"])
            row["prefix_cached_tokens"] = p["cached_tokens"]
            row["prefix_pool_tokens"] = p["pool_tokens"]
        for d in r.get("decode") or [] if _compared(r) else []:  # a retry's steps ran on another runner
            if auto_steps.get(d["context"]):
                row[f"decode_x@{d['context']}"] = d["step_s"] / auto_steps[d["context"]]
        if started and auto is not None and r.get("quality") and auto.get("quality"):
            q = score(auto["quality"], r["quality"], scorer)
            row.update(
                {
                    k: q.get(k)
                    for k in (
                        "dppl_pct",
                        "top1_agreement",
                        "greedy_identical",
                        "first_divergence",
                        "dppl_one_pass_pct",
                        "cache_sees",
                        "one_pass_sees",
                    )
                }
            )
            row["quality_method"] = q.get("method")
        out.append(row)
    return pd.DataFrame(out)


def decode(run: MatrixRun) -> Any:
    """Decode step time per started row and context (median of the repetitions, each kept), geometric-mean ratio to
    ``auto`` with a 95% interval over the repetitions (Welch on log step times: within one engine per dtype, so it does not carry
    engine-to-engine variance; ``n_engines`` says so). A retry's rows (another runner) are listed, their ratio left out."""
    import numpy as np
    import pandas as pd

    from fp8lab import stats

    auto = next((r for r in run.rows if r["label"] == "auto" and r.get("status") == "started"), None)
    base = {d["context"]: d for d in (auto or {}).get("decode") or []}
    rows = []
    for r in run.rows:
        for d in r.get("decode") or []:
            b = base.get(d["context"]) if _compared(r) else None
            ratio = lo = hi = None
            if r is auto:
                ratio = 1.0  # the baseline itself
            elif b is not None:
                x, y = np.asarray(d["reps_s"], float), np.asarray(b["reps_s"], float)
                if np.all(x > 0) and np.all(y > 0):
                    w = stats.welch_interval(np.log(x), np.log(y))
                    ratio = float(np.exp(w.estimate))
                    if np.isfinite(w.lo):
                        lo, hi = float(np.exp(w.lo)), float(np.exp(w.hi))
            rows.append(
                {
                    "label": r["label"],
                    "context": d["context"],
                    "step_ms": 1000 * d["step_s"],
                    "reps": len(d["reps_s"]),
                    "n_engines": 1,
                    "mode": ("eager" if run.spec.enforce_eager or r.get("eager") else "CUDA graphs")
                    + (", V2 runner" if r.get("without_forcing") else ""),
                    "vs_auto": ratio,
                    "vs_auto_lo": lo,
                    "vs_auto_hi": hi,
                }
            )
    return pd.DataFrame(rows)


def layers(run: MatrixRun) -> Any:
    """Per started row and attention layer: what the engine reported (dtype, ``k_scale``, ``v_scale``, impl)."""
    import pandas as pd

    return pd.DataFrame(
        [{"label": r["label"], **x} for r in run.rows for x in ((r.get("probe") or {}).get("layers") or [])]
    )
