"""The rules of the seed claims issue 35 added (29-46): Hopper's "native" FP8 (29), short requests (30), compute- vs
bandwidth-bound decode (31), preemption and concurrency (32), the software fallback (33), seed 000's own load test
(34, 35), E4M3 and quality (36), seed 003's figures (37-44, 46) and the shared 1,842 tok/s baseline (45).

Each is decided by evidence fp8lab can collect (a study's records, physics, arithmetic, introspection of the
installed vLLM, the seed's own script as issue 35 quotes it) or is ``not testable here`` with the reason."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any

from fp8lab import kvmath
from fp8lab.audit.evidence import Evidence, Missing, Report
from fp8lab.audit.pages import DECODE, PREFIX, QUALITY, SERVING
from fp8lab.audit.readers import (
    decode_detectable,
    decode_grid,
    detectable_text,
    fd,
    gb,
    physics_step_cut,
    serving_concurrency,
    serving_delta,
    serving_preemptions,
)
from fp8lab.audit.rules_memory import A100_BANDWIDTH, CLAIM21_TOK_S, model_layout
from fp8lab.audit.scale import (
    ARITHMETIC,
    COMPUTATION,
    CONFIRMED,
    CONTRADICTED,
    INCONCLUSIVE,
    INTROSPECTION,
    NOT_TESTABLE,
    PHYSICS,
    REFUTED,
    SCRIPT,
    UNTESTED,
    Finding,
    finding,
    parts_verdict,
    per_report,
    rule,
)


# --------------------------------------------------------------------------------------------- claims 29, 30
def _short_points(rep: Report) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Study 06's points at its shortest context, and its batch-1 point there."""
    pts = decode_grid(rep)
    ctx = min(int(p["context_len"]) for p in pts)
    at = [p for p in pts if int(p["context_len"]) == ctx]
    b1 = min(at, key=lambda p: int(p["batch"]))
    return pts, b1


def _pt(p: dict[str, Any]) -> str:
    return (
        f"B={p['batch']}, {int(p['context_len']):,} tokens: step x{p['ratio']:.3f} "
        f"[{p['ratio_ci_low']:.3f}, {p['ratio_ci_high']:.3f}]"
    )


@per_report("29")
def rule_hopper_no_overhead(rep: Report) -> Finding:
    """Study 06 on a Hopper GPU (paired decode steps, fp8/auto with 95% CIs over the grid): "throughput unchanged
    or better" fails where FP8's step is longer beyond its CI (a conversion cost per step that Hopper did not
    remove); it holds when no point is slower beyond its CI. The KV memory saved is claim 3a's."""
    pts = decode_grid(rep)
    slower = [p for p in pts if p["ratio_ci_low"] > 1]
    faster = [p for p in pts if p["ratio_ci_high"] < 1]
    v = REFUTED if slower else CONFIRMED
    worst = max(pts, key=lambda p: p["ratio"])
    return finding(
        v,
        f"{len(slower)} of {len(pts)} grid points slower beyond the CI, {len(faster)} faster; slowest {_pt(worst)} "
        f"({rep.number(DECODE)})",
        "FP8's decode step is longer at short contexts: a fixed per-step cost that native FP8 did not remove"
        if slower
        else "no point slower beyond its CI",
        {"slower": len(slower), "faster": len(faster)},
        setting=rep.setting(DECODE),
        detectable=decode_detectable(rep),
    )


@per_report("30")
def rule_short_requests_slower(rep: Report) -> Finding:
    """Study 06 at its shortest context and smallest batch (paired decode steps, 95% CI): FP8's step longer beyond
    the CI shows that FP8 can slow short requests at low concurrency (confirmed). "May slow" claims that it happens
    somewhere, which one setting where it does not cannot refute: otherwise inconclusive. Without Study 06: Study
    01's throughput delta at its smallest concurrency, the same way."""
    if rep.optional(DECODE) is not None:
        _, b1 = _short_points(rep)
        v = CONFIRMED if b1["ratio_ci_low"] > 1 else INCONCLUSIVE
        return finding(
            v,
            _pt(b1) + f" ({rep.number(DECODE)})",
            "FP8's fixed per-step cost outweighs the halved KV read at short contexts"
            if v == CONFIRMED
            else "FP8 not slower beyond its CI at the shortest context (an existence claim: not refuted by one setting)",
            {"ratio": b1["ratio"]},
            setting=rep.setting(DECODE),
            detectable=decode_detectable(rep),
        )
    cs = serving_concurrency(rep)
    if not cs:
        raise Missing(f"no decode grid ({rep.number(DECODE)}) and no concurrency sweep ({rep.number(SERVING)})")
    d = serving_delta(rep, "output tok/s", cs[0])
    v = CONFIRMED if d["hi_pct"] < 0 else INCONCLUSIVE
    return finding(
        v,
        f"throughput @c={cs[0]} {fd(d)} ({rep.number(SERVING)})",
        "throughput at the smallest concurrency (an existence claim: not refuted by one setting)",
        {"delta": dict(d)},
        setting=rep.setting(SERVING),
        detectable=detectable_text({"throughput": d}),
    )


# --------------------------------------------------------------------------------------------- claim 31
#: Dense 16-bit Tensor Core FLOP/s and memory bandwidth (NVIDIA datasheets: A100 80 GB SXM 312 TFLOP/s BF16,
#: 2,039 GB/s; H100 SXM 989 TFLOP/s, 3,350 GB/s; H200 989 TFLOP/s, 4,800 GB/s): their ratio is the arithmetic
#: intensity (FLOP per byte read) a kernel needs before compute, not memory, bounds it.
GPU_RIDGE: dict[str, tuple[float, float]] = {
    "A100 80 GB": (312e12, A100_BANDWIDTH),
    "H100 SXM": (989e12, 3350e9),
    "H200": (989e12, 4800e9),
}
CLAIM31_MODEL, CLAIM31_BATCH, CLAIM31_CONTEXT = "qwen3-14b", 64, 1024


@rule("31")
def rule_decode_compute_bound(ev: Evidence) -> Finding:
    """Physics (roofline): a decode step of batch B reads every weight once (2 bytes each in 16-bit) and does 2
    FLOPs per weight per sequence, plus each sequence's KV; so its arithmetic intensity is at most B FLOP/byte. At
    seed 000's largest concurrency (64) on Qwen3-14B that is below the ridge point (FLOP/s over bytes/s) of an A100,
    H100 or H200: decode is bandwidth-bound there, so "compute-bound" is refuted."""
    lay = model_layout(ev, CLAIM31_MODEL)
    if lay is None:
        return Finding(NOT_TESTABLE, f"no {CLAIM31_MODEL} config", "data/configs/qwen3-14b holds it")
    p = kvmath.estimate_param_count(lay)
    kvb = kvmath.kv_bytes_per_token(lay, "auto")

    def intensity(b: int, ctx: int) -> float:
        return 2 * p * b / (2 * p + b * ctx * kvb)

    ridges = {g: f / bw for g, (f, bw) in GPU_RIDGE.items()}
    i64 = intensity(CLAIM31_BATCH, CLAIM31_CONTEXT)
    v = REFUTED if i64 < min(ridges.values()) else INCONCLUSIVE
    return Finding(
        v,
        f"Qwen3-14B ({p / 1e9:.1f}B parameters, {kvb:,} KV bytes/token): intensity {intensity(1, CLAIM31_CONTEXT):.2f} "
        f"FLOP/byte at batch 1, {i64:.1f} at batch {CLAIM31_BATCH} ({CLAIM31_CONTEXT:,} tokens each); ridge points "
        + ", ".join(f"{g} {r:.0f}" for g, r in ridges.items()),
        "below the ridge the step waits on memory, not on the Tensor Cores: bandwidth-bound",
        {"intensity_b1": intensity(1, CLAIM31_CONTEXT), "intensity_b64": i64, "ridges": ridges},
        {},
        "Qwen3-14B config; datasheet FLOP/s and bandwidth",
        "exact (an upper bound on intensity)",
        PHYSICS,
    )


# --------------------------------------------------------------------------------------------- claim 32
@per_report("32")
def rule_preemption_grows(rep: Report) -> Finding:
    """Study 01's preemptions per closed-loop concurrency (summed over trials): more at the largest concurrency than
    at the smallest for some dtype confirms that raising concurrency raises preemption (the KV budget binds); fewer
    refutes; none at any concurrency is inconclusive (the load never filled the KV cache)."""
    pre = serving_preemptions(rep)
    if len(pre) < 2:
        raise Missing(f"{rep.label_of(SERVING)} recorded preemptions at fewer than two concurrencies")
    lo, hi = min(pre), max(pre)
    rises = {d: (pre[lo].get(d, 0), pre[hi].get(d, 0)) for d in pre[hi]}
    text = ", ".join(f"{d} {a:g} -> {b:g}" for d, (a, b) in rises.items())
    if any(b > a for a, b in rises.values()):
        v = CONFIRMED
    elif any(b < a for a, b in rises.values()):
        v = REFUTED
    else:
        v = INCONCLUSIVE
    return finding(
        v,
        f"preemptions c={lo} -> c={hi}: {text} ({rep.number(SERVING)})",
        "preemption appears once the concurrent requests' KV exceed the cache; FP8's doubled capacity moves that "
        "point (a dtype that never filled its cache shows none)",
        {"preemptions": {str(k): v for k, v in pre.items()}},
        setting=rep.setting(SERVING),
        detectable="one preemption (counts)",
    )


# --------------------------------------------------------------------------------------------- claim 33
CPU_ATTN_FILE = "v1/attention/backends/cpu_attn.py"
CPU_FP8_REFUSAL = "FP8 KV cache on CPU requires"


def _vllm_source(rel: str) -> str | None:
    """The text of a file of the installed vLLM (found without importing it), or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    f = Path(spec.origin).parent / rel
    return f.read_text(errors="replace") if f.is_file() else None


@rule("33")
def rule_software_fallback(ev: Evidence) -> Finding:
    """Introspection of the installed vLLM: where a device has no FP8 KV kernel (the CPU build without AVX-512 or
    AMX), does vLLM fall back to emulating it? Its CPU attention backend raising NotImplementedError for FP8 KV
    there contradicts "falls back" (fp8lab's own emulation, fp8lab.engine.fp8emu, exists because vLLM has none). "Must be
    slower" needs a GPU without FP8 Tensor Cores (an A100), which no study ran: untested."""
    src = _vllm_source(CPU_ATTN_FILE)
    if src is None:
        return Finding(NOT_TESTABLE, f"vLLM's {CPU_ATTN_FILE} not installed", "install the vLLM CPU build")
    m = re.search(r'raise NotImplementedError\(\s*"(' + re.escape(CPU_FP8_REFUSAL) + r'[^"]*)"', src)
    parts = {"falls back to emulation": CONTRADICTED if m else UNTESTED, "must be slower": UNTESTED}
    return Finding(
        parts_verdict(parts),
        (f'installed vLLM {CPU_ATTN_FILE}: raise NotImplementedError("{m.group(1)}")' if m else "no refusal found")
        + "; no A100 run here",
        "vLLM refuses FP8 KV where it has no kernel instead of emulating it; on GPUs without FP8 Tensor Cores the "
        "attention kernels convert FP8 to 16-bit in registers (no separate fallback path)",
        {"parts": parts},
        {},
        f"installed vLLM source ({CPU_ATTN_FILE})",
        "exact (source text)",
        INTROSPECTION,
    )


# --------------------------------------------------------------------------------------------- claims 34, 35
#: Seed 000's load test as issue 35 quotes its script: the request classes (input, output tokens), the mix its
#: text states, and how the script draws a class (uniformly over the three); its request body has no "stream" field.
SEED000_CLASSES = {"short": (128, 64), "medium": (1024, 256), "long": (8192, 512)}
SEED000_STATED_MIX = {"short": 6, "medium": 3, "long": 1}
SEED000_SCRIPT_DRAW = {"short": 1, "medium": 1, "long": 1}


def _mean_tokens(mix: dict[str, int]) -> tuple[float, float]:
    n = sum(mix.values())
    return tuple(sum(mix[k] * SEED000_CLASSES[k][i] for k in mix) / n for i in (0, 1))  # type: ignore[return-value]


@rule("34")
def rule_seed000_mix(ev: Evidence) -> Finding:
    """Seed 000's script as quoted (issue 35) draws the request class uniformly: the shares it sends are 1/3 each,
    not 0.6 / 0.3 / 0.1, so the stated 6:3:1 mix is refuted by the script itself; the arithmetic shows what the
    uniform draw does to the mean request (its input tokens)."""
    st, dr = _mean_tokens(SEED000_STATED_MIX), _mean_tokens(SEED000_SCRIPT_DRAW)
    n = sum(SEED000_STATED_MIX.values())
    return Finding(
        REFUTED,
        "shares stated "
        + ":".join(f"{SEED000_STATED_MIX[k] / n:.1f}" for k in SEED000_CLASSES)
        + ", drawn "
        + ":".join(f"{1 / 3:.2f}" for _ in SEED000_CLASSES)
        + f"; mean input {st[0]:,.0f} tokens stated vs {dr[0]:,.0f} sent (x{dr[0] / st[0]:.1f}), mean output "
        f"{st[1]:,.0f} vs {dr[1]:,.0f}",
        "its figures (claim 5) come from a load 2.6 times heavier in input tokens than the one it describes",
        {"stated_mean": st, "drawn_mean": dr},
        {},
        "seed 000's script as issue 35 quotes it",
        "exact (arithmetic on the script)",
        SCRIPT,
    )


PROTOCOL_FILES = ("entrypoints/openai/completion/protocol.py", "entrypoints/openai/protocol.py")


@rule("35")
def rule_seed000_streaming(ev: Evidence) -> Finding:
    """Introspection of the installed vLLM's OpenAI-compatible request schema: a request without a ``stream`` field
    gets its default; a default of False means seed 000's script (no stream field, issue 35) received each
    completion in one response, so its TTFT was the whole request's time and it could not time tokens: "streaming"
    refuted. Study 01's client that does not read the stream shows what such a client reports."""
    for rel in PROTOCOL_FILES:
        src = _vllm_source(rel)
        m = re.search(r"^\s*stream:\s*([^=\n]+)=\s*(\w+)", src or "", re.M)
        if m:
            default = m.group(2)
            v = REFUTED if default == "False" else INCONCLUSIVE
            return Finding(
                v,
                f"installed vLLM {rel}: stream: {m.group(1).strip()} = {default}",
                "without the field the server answers with one non-streamed response: no first-token time, no "
                "per-token gaps",
                {"default": default},
                {},
                f"installed vLLM source ({rel}); seed 000's script as issue 35 quotes it",
                "exact (source text)",
                INTROSPECTION,
            )
    return Finding(NOT_TESTABLE, "no OpenAI request schema found in the installed vLLM", "install vLLM")


# --------------------------------------------------------------------------------------------- claim 36
@per_report("36")
def rule_e4m3_quality(rep: Report) -> Finding:
    """Study 03's own verdict on its ``fp8`` (E4M3) config (perplexity change with its paired interval, top-3 and
    task accuracy): ``negligible`` confirms that E4M3 kept quality on this model; a resolved loss refutes; else
    inconclusive. On a CPU without the FP8 KV kernel the config is ``fp8 (emulated)`` (:mod:`fp8lab.fp8emu`: K and V
    rounded through E4M3 into a bf16 cache), judged the same way and named so."""
    s = rep.study(QUALITY)
    lab = next((x for x in ("fp8", "fp8 (emulated)") if s.get(f"{x}.verdict") is not None), None)
    if lab is None:
        raise Missing(f"{rep.label_of(QUALITY)} recorded no verdict for fp8")
    word = s[f"{lab}.verdict"]
    lo, hi = s.get(f"{lab}.delta_ppl_pct_ci_lo"), s.get(f"{lab}.delta_ppl_pct_ci_hi")
    v = CONFIRMED if word == "negligible" else REFUTED if word in ("degraded", "loss", "worse") else INCONCLUSIVE
    return finding(
        v,
        f"{lab} (E4M3): Study {rep.number(QUALITY)} verdict '{word}', perplexity {float(s.get(f'{lab}.delta_ppl_pct') or 0):+.2f}% "
        + (f"[{float(lo):+.2f}, {float(hi):+.2f}]" if lo is not None and hi is not None else "")
        + f", top-3 match {float(s.get(f'{lab}.top3_match') or 0):.2f} ({rep.number(QUALITY)})",
        "E4M3 KV kept what the model says on this model",
        {"verdict_03": word},
        setting=rep.setting(QUALITY),
        detectable=f"+-{(float(hi) - float(lo)) / 2:.2f}% of perplexity (95% CI half-width, paired by window)"
        if lo is not None and hi is not None
        else "",
    )


# ----------------------------------------------------------------------------------- claims 37, 38, 44, 46
def _untestable(measured: str, why: str) -> Finding:
    return Finding(NOT_TESTABLE, measured, why)


@rule("37")
def rule_gsm8k(ev: Evidence) -> Finding:
    """Needs GSM8K on a real model with FP8 weights + KV against bf16; fp8lab runs FP8 on the KV cache only, its
    quality model is the 6.8M-parameter shipped model (which cannot do grade-school arithmetic) and the 8B shape has
    dummy weights: not testable here."""
    return _untestable(
        "no GSM8K run; no FP8 weights run",
        "needs a real model that solves GSM8K, run with --quantization fp8 and FP8 KV against bf16",
    )


@rule("38")
def rule_l2_miss(ev: Evidence) -> Finding:
    """An L2 miss rate is a hardware counter (Nsight Compute); no study records one: not testable here."""
    return _untestable("no study records hardware counters", "needs Nsight Compute's L2 counters on the GPU")


@rule("44")
def rule_fa2_memory(ev: Evidence) -> Finding:
    """A kernel's memory-bandwidth utilisation is a profiler figure no study records, and vLLM's FP8 KV on the H200
    ran on FlashAttention 3, not flash-attn-2: not testable here."""
    return _untestable(
        "no study records a kernel's memory utilisation; the H200's fp8 engines used FlashAttention 3",
        "needs a profiler (Nsight Compute) on flash-attn-2 with FP8 KV on the seed's GPU",
    )


@rule("46")
def rule_yarn_recall(ev: Evidence) -> Finding:
    """Needs a long-context retrieval benchmark on a real model with YaRN rope scaling; the shipped model cannot
    retrieve and the 128K shape has dummy weights; the claim is about rope scaling, not FP8: not testable here."""
    return _untestable(
        "no retrieval benchmark; no real long-context model",
        "needs a real model with and without YaRN factor 4 on a recall benchmark",
    )


# --------------------------------------------------------------------------------------------- claim 39
CLAIM39_COST = 0.38


@rule("39")
def rule_cost_38(ev: Evidence) -> Finding:
    """Cost per second of output at 38% is a x2.6 throughput on the same hardware, a 62% cut of the decode step:
    above the 50% that halving every byte read (weights and KV alike) allows a memory-bound step, and an A100 has
    no FP8 math to speed a compute-bound one (physics)."""
    f = physics_step_cut(1 - CLAIM39_COST, f"cost at {100 * CLAIM39_COST:.0f}% (x{1 / CLAIM39_COST:.2f} throughput)")
    if f is None:
        return Finding(INCONCLUSIVE, "within the bound", "")
    return f


# --------------------------------------------------------------------------------------------- claims 40, 41
def _prefix_gains(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w: s[f"{w}.gain"] for w in ("chat", "system", "json") if isinstance(s.get(f"{w}.gain"), dict)}


@per_report("40")
def rule_prefix_gain(rep: Report) -> Finding:
    """Study 07 (prefix caching on, both dtypes at the same KV budget, paired trials): at the working set beyond
    auto's knee, FP8's hit-rate gain (percentage points, with its interval) and throughput ratio. A hit-rate gain
    beyond its interval with a throughput ratio above 1 at some workload confirms that FP8 raises both; no gain at
    any workload refutes it."""
    s = rep.optional(PREFIX)
    if s is None:
        raise Missing(f"no {rep.label_of(PREFIX)} summary")
    g = _prefix_gains(dict(s))
    if not g:
        raise Missing(f"{rep.label_of(PREFIX)} recorded no gain beyond auto's knee")
    both = {w: x for w, x in g.items() if (x.get("dhit_pp_ci_low") or 0) > 0 and (x.get("tput_ratio") or 0) > 1}
    v = CONFIRMED if both else REFUTED
    text = "; ".join(
        f"{w} N={int(x.get('n_active') or 0)}: hit {100 * x['auto_hit_rate']:.1f}% -> {100 * x['fp8_hit_rate']:.1f}% "
        f"({x['dhit_pp']:+.1f} pp [{_num(x.get('dhit_pp_ci_low')):+.1f}, {_num(x.get('dhit_pp_ci_high')):+.1f}]),"
        f" throughput x{_num(x.get('tput_ratio')):.2f}"
        for w, x in g.items()
    )
    return finding(
        v,
        text + f" ({rep.number(PREFIX)})",
        "beyond auto's knee FP8 holds twice the blocks and keeps prefixes auto evicts; the size of the gain is the "
        "working set's, not a constant",
        {"gains": g},
        setting=rep.setting(PREFIX),
        detectable="the paired intervals shown",
    )


@per_report("41")
def rule_cross_request(rep: Report) -> Finding:
    """Study 07's hit-vs-cold check: the same prompts answered after a prefix-cache hit (blocks another request
    wrote) and cold. FP8's outputs identical token for token with zero logprob difference, with cached tokens > 0,
    contradict contamination by a previous request's KV (refuted); any FP8 difference is inconclusive (it may be
    numerical, not contamination)."""
    s = rep.optional(PREFIX)
    if s is None:
        raise Missing(f"no {rep.label_of(PREFIX)} summary")
    rows = [r for r in s.get("correctness") or [] if str(r.get("kv_dtype", "")).startswith("fp8")]
    rows = [r for r in rows if (r.get("cached_tokens_min") or 0) > 0]
    if not rows:
        raise Missing(f"{rep.label_of(PREFIX)} ran no hit-vs-cold check of fp8")
    same = all(r.get("tokens_equal") == 1.0 and (r.get("max_abs_dlogprob") or 0) == 0 for r in rows)
    return finding(
        REFUTED if same else INCONCLUSIVE,
        "; ".join(
            f"{r['kind']}: {r.get('prompts')} prompts, >= {r['cached_tokens_min']} cached tokens, tokens equal "
            f"{r['tokens_equal']:.0%}, max |dlogprob| {r.get('max_abs_dlogprob')}"
            for r in rows
        )
        + f" ({rep.number(PREFIX)})",
        "a hit on blocks another request wrote gives the cold answer exactly" if same else "FP8 outputs differ",
        {"rows": len(rows)},
        setting=rep.setting(PREFIX),
        detectable="exact (bit-identical comparison)",
    )


# --------------------------------------------------------------------------------------------- claim 42
CLAIM42_ENTRIES, CLAIM42_CONTEXT, CLAIM42_BLOCKS = 16_384, 128 * 1024, (16, 256)


@rule("42")
def rule_page_table(ev: Evidence) -> Finding:
    """Arithmetic: a request's block table has ceil(context / block_size) entries (vLLM sizes each row as
    cdiv(max_model_len, block_size)); at 131,072 tokens with the seed's block sizes 16 and 256 that is 8,192 and
    512. 16,384 is neither (it needs block size 8, or 256K tokens at block 16): refuted."""
    n = {b: -(-CLAIM42_CONTEXT // b) for b in CLAIM42_BLOCKS}
    v = REFUTED if CLAIM42_ENTRIES not in n.values() else CONFIRMED
    return Finding(
        v,
        ", ".join(f"block {b}: {e:,} entries" for b, e in n.items())
        + f" at {CLAIM42_CONTEXT:,} tokens; claimed {CLAIM42_ENTRIES:,}",
        f"{CLAIM42_ENTRIES:,} entries = {CLAIM42_CONTEXT:,} / 8 or 262,144 / 16",
        {"entries": n},
        {},
        "arithmetic on the seed's context and block sizes",
        "exact (integer arithmetic)",
        ARITHMETIC,
    )


# --------------------------------------------------------------------------------------------- claim 43
CLAIM43_FACTOR = 0.95


@rule("43")
def rule_logit_scale(ev: Evidence) -> Finding:
    """Computation (torch, seeded random logits): multiplying logits by 0.95 > 0 keeps their order, so greedy
    tokens and the top-3 set (the reports' stability measure) cannot change; it is sampling at temperature 1/0.95,
    which raises the entropy (less stable, not more): refuted."""
    try:
        import torch
    except ImportError as e:
        return Finding(NOT_TESTABLE, f"torch not available: {e}", "install torch")
    g = torch.Generator().manual_seed(0)
    z = torch.randn(256, 1000, generator=g) * 4
    same = bool((z.topk(3).indices == (CLAIM43_FACTOR * z).topk(3).indices).all())

    def entropy(x: torch.Tensor) -> float:
        p = x.softmax(-1)
        return float(-(p * p.log()).sum(-1).mean())

    h0, h1 = entropy(z), entropy(CLAIM43_FACTOR * z)
    return Finding(
        REFUTED if same and h1 >= h0 else INCONCLUSIVE,
        f"top-3 of 256 random logit rows unchanged: {same}; mean entropy {h0:.3f} -> {h1:.3f} nats",
        "a positive scale cannot change greedy or top-k choices; it only flattens sampling",
        {"top3_unchanged": same, "entropy": [h0, h1]},
        {},
        f"torch {torch.__version__}",
        "exact (order is invariant under a positive scale)",
        COMPUTATION,
    )


# --------------------------------------------------------------------------------------------- claim 45
@rule("45")
def rule_shared_baseline(ev: Evidence) -> Finding:
    """Physics: Llama-2-70B in FP16 at batch 1 on one A100 reads its weights once per token, so it decodes at most
    bandwidth / weight bytes tokens per second (claim 21's bound, even x17 for input tokens); 1,842 tok/s is far
    above it, so the figure cannot be a measurement of that setting, and the same four digits for Qwen3-14B on vLLM
    are then a copied number, not two baselines: refuted."""
    lay = model_layout(ev, "llama-2-70b")
    if lay is None:
        return Finding(NOT_TESTABLE, "no llama-2-70b config", "data/configs/llama-2-70b holds it")
    from fp8lab import roofline

    w = roofline.weight_bytes_per_step(lay, "float16", 1)
    bound = A100_BANDWIDTH / w
    return Finding(
        REFUTED if CLAIM21_TOK_S > 17 * bound else INCONCLUSIVE,
        f"Llama-2-70B FP16 on an A100 at batch 1: at most {bound:.1f} tok/s ({gb(w)} per token at 2,039 GB/s), "
        f"x17 with input tokens {17 * bound:.0f}; both seeds quote {CLAIM21_TOK_S:,.0f}",
        "one of the two settings cannot produce the figure; identical to four digits across models, engines and "
        "GPUs, it is one number quoted twice",
        {"bound_tok_s": bound},
        {},
        "Llama-2-70B config; A100 80 GB bandwidth",
        "exact (an upper bound)",
        PHYSICS,
    )


def _num(v: object) -> float:
    """A recorded number, NaN where the summary holds none (a deterministic cell records no interval)."""
    return float(v) if isinstance(v, (int, float)) else math.nan
