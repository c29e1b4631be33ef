"""Does each scoring method see the KV quantization, per attention backend? One command per device:

    python scripts/scoring_check.py                                   # CPU: CPU_ATTN, fp8 native or emulated
    python scripts/scoring_check.py --backends FLASH_ATTN TRITON_ATTN FLASHINFER \\
        --kv fp8 turboquant_k8v4 --out reports/h200/scoring_check.csv  # the H200

For every backend it runs ``auto`` and each ``--kv`` dtype on the same held-out windows, scored two ways
(:mod:`fp8lab.scoring`): through the KV cache (the window's first ``--context`` tokens as the prompt, the rest
forced token by token) and in one prefill with prompt logprobs. Per (backend, dtype, method) it prints and writes
``positions``, ``max_abs_dlogprob`` / ``mean_abs_dlogprob`` (nats) and ``frac_differ`` against ``auto`` on the same
backend, plus ``gap_*`` (the dtype's one-pass scores against its own through-the-cache ones). A method whose
``frac_differ`` is 0 for a quantized dtype scored over unquantized K/V (vllm-notes section 10: turboquant_k8v4's
one-pass perplexity equalled auto's). A backend or dtype that does not start is a row with its status and reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def _vector(res, phase: str) -> np.ndarray:
    from fp8lab.scoring import sequence_logprobs

    rec = res.records[res.records.phase == phase].set_index("tag")
    return np.concatenate([np.asarray(sequence_logprobs(rec.loc[t])[0], float) for t in sorted(rec.index)])


def held_out_windows(model: str, n: int, tokens: int) -> list[tuple[int, ...]]:
    """The held-out windows in ``model``'s tokenizer; ``model`` as a user gives it (a folder, or the real model's name
    ``smollm2-135m-instruct``), resolved as the studies resolve it (:func:`fp8lab.specs.resolve_model`)."""
    from fp8lab.quality import ppl_windows
    from fp8lab.specs import resolve_model

    return ppl_windows(resolve_model(model), n, tokens)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    from fp8lab.engine.capability import kv_support
    from fp8lab.engine.devices import cpu_layout
    from fp8lab.engine.results import run_cached, run_emulated
    from fp8lab.paths import TINY_MODEL_DIR
    from fp8lab.scoring import cache_check, forced_request, one_pass_request
    from fp8lab.specs import EngineSpec, Phase, resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(TINY_MODEL_DIR))
    ap.add_argument("--backends", nargs="*", default=[None], help="attention backends to pin (default: vLLM's pick)")
    ap.add_argument("--kv", nargs="+", default=["fp8"], help="quantized KV dtypes compared with auto")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--window-tokens", type=int, default=256)
    ap.add_argument("--context", type=int, default=64, help="tokens of each window given as the prompt")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--kv-cache-gib", type=float, default=None, help="None: vLLM sizes it (GPU); CPU: 0.25")
    ap.add_argument("--out", type=Path, default=None, help="CSV to write")
    a = ap.parse_args(argv)

    wins = held_out_windows(a.model, a.windows, a.window_tokens)
    phases = [
        Phase(
            "cache",
            tuple(forced_request(w[: a.context], w[a.context :], a.top_k, tag=f"w{i}") for i, w in enumerate(wins)),
        ),
        Phase(
            "one_pass",
            tuple(one_pass_request(w[: a.context], w[a.context :], a.top_k, tag=f"w{i}") for i, w in enumerate(wins)),
        ),
    ]
    gib = a.kv_cache_gib
    rows = []
    for backend in a.backends:
        kw = dict(model=a.model, max_model_len=max(1024, a.window_tokens + 8), skip_tokenizer_init=True)
        kw["kv_cache_gib"] = gib if gib is not None else (0.25 if cpu_layout() else None)
        base = run_cached(
            EngineSpec(kv_cache_dtype="auto", attention_backend=backend, **kw), phases, study="scoring_check"
        )
        for kv in a.kv:
            spec = EngineSpec(kv_cache_dtype=kv, attention_backend=backend, **kw)
            sup = kv_support(kv, resolve_model(a.model))
            if not sup.native and sup.emulated:
                res = run_emulated(spec, phases, study="scoring_check")
            else:
                res = run_cached(spec, phases, study="scoring_check")
            row0 = {
                "backend_asked": backend or "auto-selected",
                "attention_backend": (res.engine or {}).get("attention_backend"),
                "kv_cache_dtype": kv,
                "fp8_emulation": res.extra.get("emulated"),
                "status": res.status if base.ok else f"auto: {base.status}",
                "error": (res.error or base.error or "")[:200],
            }
            if not (res.ok and base.ok):
                rows.append(row0)
                continue
            gap = cache_check(_vector(res, "cache"), _vector(res, "one_pass"))
            for method in ("cache", "one_pass"):
                r = {**row0, "method": method, **cache_check(_vector(base, method), _vector(res, method))}
                if method == "cache":
                    r.update({f"gap_{k}": v for k, v in gap.items() if k != "positions"})
                r["forced_ok"] = bool(res.records[res.records.phase == "cache"].forced_ok.all())
                rows.append(r)
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(df.drop(columns=["error"], errors="ignore").to_string(index=False))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out, index=False)
    return df


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
