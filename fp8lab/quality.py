"""Study 03: what FP8 KV cache does to a model's outputs, measured several ways against ``auto``.

The field reports' protocol (kept, exactly): send each prompt to both engines greedily and compare
the **first 3 generated token ids**; the per-prompt fraction that agree is the "top-3 token match
rate" (0.92-0.96 "fine", below 0.85 "calibration failed"). Three greedy tokens say little and one
early flip changes everything after it, so this module adds:

- **greedy agreement** over ``gen_tokens``: identical-prefix length, first divergence, agreement rate;
- **teacher-forced** scoring: the baseline's own greedy continuation is appended to the prompt and
  scored by every engine with ``prompt_logprobs`` (one prefill, so one flip cannot cascade; the
  prefill reads the quantized cache: vllm-notes section 6), per position: top-k overlap (k = 1..K),
  |delta logprob| of the actual token, and a KL lower bound from the top-k lists (:func:`kl_topk`);
- **perplexity** on held-out text windows, and its delta;
- a **copy task** (retrieve a span from earlier in the context after a cue), scored by accuracy;
- the **round trip** of the model's real K/V (and Q) through each FP8 format and rounding, and the
  error it puts on attention outputs (:func:`roundtrip_table`, :func:`attention_error_table`).

Engines: one reference run of ``auto`` makes the greedy continuations; then every KV config
(``auto`` again, each fp8 dtype, each scale set) runs once with four phases (greedy, teacher,
ppl, task), so the baseline is measured exactly as the candidates are, and ``auto`` against the
reference run is the run-to-run noise floor (exactly zero on CPU).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.paths import PROMPTS_DIR, TINY_MODEL_DIR
from fp8lab.specs import (
    EngineSpec,
    KVDtype,
    Phase,
    Request,
    SpecError,
    check_choice,
    check_file,
    check_float,
    check_int,
    check_model_folder,
    check_tokenizer,
    read_text,
    resolve_model,
)
from fp8lab.stats import bootstrap_ci, bootstrap_mean_ci

#: The field reports' protocol: first N generated tokens, its "calibration failed" threshold and "fine" band.
REPORT_N_TOKENS = 3
REPORT_THRESHOLD = 0.85
REPORT_FINE_BAND = (0.92, 0.96)
BASELINE = "auto"
DEFAULT_PROMPTS = PROMPTS_DIR / "quality_prompts.jsonl"
PHASES = ("greedy", "teacher", "ppl", "task", "task_tf")


# ============================================================================ pure metrics
def _ids(x: Any) -> list[int]:
    return [] if x is None else [int(t) for t in list(x)]


def token_match_fraction(reference: Sequence[int], candidate: Sequence[int], n: int = REPORT_N_TOKENS) -> float:
    """Fraction of the first ``n`` generated token ids that agree position by position (the reports'
    "top-3 token match" for ``n = 3``). A missing candidate token counts as a mismatch."""
    ref, cand = _ids(reference)[:n], _ids(candidate)[:n]
    if len(ref) < n:
        raise SpecError("token_match_fraction", "reference", len(ref), f"at least n = {n} tokens")
    return sum(1 for i, t in enumerate(ref) if i < len(cand) and cand[i] == t) / n


def identical_prefix_len(reference: Sequence[int], candidate: Sequence[int]) -> int:
    """Number of leading tokens that agree."""
    n = 0
    for a, b in zip(_ids(reference), _ids(candidate), strict=False):
        if a != b:
            break
        n += 1
    return n


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """0-based position of the first disagreeing token, or None when ``candidate`` reproduces all of
    ``reference`` (a shorter candidate diverges where it stops)."""
    ref = _ids(reference)
    n = identical_prefix_len(ref, candidate)
    return None if n >= len(ref) else n


def agreement_rate(reference: Sequence[int], candidate: Sequence[int]) -> float:
    """Fraction of the reference's positions where the candidate has the same token (after a flip the
    two texts differ, so this mixes FP8 error with cascade: read it with :func:`first_divergence`)."""
    ref, cand = _ids(reference), _ids(candidate)
    return sum(1 for i, t in enumerate(ref) if i < len(cand) and cand[i] == t) / len(ref) if ref else float("nan")


def topk_overlap(a_ids: Sequence[int], b_ids: Sequence[int], k: int) -> float:
    """``|top-k(a) ∩ top-k(b)| / k`` of two rank-ordered id lists (k = 1: do the argmaxes agree)."""
    return len(set(_ids(a_ids)[:k]) & set(_ids(b_ids)[:k])) / k


def kl_topk(p: Mapping[int, float], q: Mapping[int, float], eps: float = 1e-12) -> float:
    """KL(P || Q) in nats, estimated from partial log-probability lists, remainder mass lumped.

    ``p``, ``q``: ``{token_id: logprob}`` as returned for one position (top-k plus the actual token).
    Over the ids both know, ``S``, and one bucket ``R`` for everything else
    (``P(R) = 1 - Σ_S P``, same for Q): ``Σ_S p log(p/q) + P(R) log(P(R)/Q(R))``. That is the exact KL
    of the two distributions coarse-grained to ``S ∪ {R}``, hence a **lower bound** on the true KL
    (log-sum inequality / data processing, Cover & Thomas, Elements of Information Theory, 2.7.1).
    """
    shared = sorted(set(p) & set(q))
    ps = np.exp(np.array([p[t] for t in shared], dtype=np.float64))
    qs = np.exp(np.array([q[t] for t in shared], dtype=np.float64))
    kl = float(np.sum(ps * (np.log(np.maximum(ps, eps)) - np.log(np.maximum(qs, eps)))))
    pr, qr = max(1.0 - float(ps.sum()), 0.0), max(1.0 - float(qs.sum()), 0.0)
    if pr > eps:
        kl += pr * (math.log(pr) - math.log(max(qr, eps)))
    return max(kl, 0.0)


def perplexity(logprobs: Sequence[float]) -> float:
    """``exp(-mean logprob)`` over the finite entries (natural log; position 0 has none)."""
    a = np.asarray(list(logprobs), dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.exp(-a.mean())) if a.size else float("nan")


def delta_ppl_pct(nll_base: Sequence[float], nll_cand: Sequence[float], n_tokens: Sequence[int]) -> float:
    """Relative perplexity change in %, token-weighted over windows: ``100 (exp((Σ nll_c − Σ nll_b) / Σ n) − 1)``."""
    nb, nc, n = (np.asarray(list(x), dtype=np.float64) for x in (nll_base, nll_cand, n_tokens))
    return float(100.0 * math.expm1((nc.sum() - nb.sum()) / n.sum()))


# ============================================================================ specs
@dataclass(frozen=True)
class KVConfig:
    """One KV-cache configuration compared against the baseline: a ``label`` (unique, used in tables),
    the model folder (a scale set is another folder of the same model) and its ``kv_cache_dtype``."""

    label: str
    model: str
    kv_cache_dtype: KVDtype

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label or "/" in self.label:
            raise SpecError("KVConfig", "label", self.label, "a non-empty name without '/'")
        check_choice(self, "kv_cache_dtype", self.kv_cache_dtype, KVDtype)

    @property
    def is_baseline(self) -> bool:
        return self.label == BASELINE


def kv_configs(model: str, kv_dtypes: Sequence[str], scale_sets: Sequence[str] = ()) -> tuple[KVConfig, ...]:
    """The baseline ``auto`` first (added when missing), then each kv dtype, then each scale set
    (a model folder whose ``config.json`` carries a compressed-tensors ``kv_cache_scheme``; it runs
    with ``kv_cache_dtype="fp8"``, label ``fp8+<folder name>``)."""
    from fp8lab.kvcapture import check_kv_scales, kv_cache_scheme

    model = resolve_model(model)
    dts = [BASELINE] + [d for d in kv_dtypes if d != BASELINE]
    if len(set(dts)) != len(dts):
        raise SpecError("QualitySpec", "kv_dtypes", list(kv_dtypes), "distinct dtypes")
    out = [KVConfig(d, model, d) for d in dts]  # type: ignore[arg-type]
    for s in scale_sets:
        path = resolve_model(str(s))
        if kv_cache_scheme(path) is None:
            raise SpecError(
                "QualitySpec",
                "scale_sets",
                s,
                "model folders whose config.json has quantization_config.kv_cache_scheme (vllm-notes 4)",
            )
        check_kv_scales(path)  # NaN, inf, zero, negative or wrongly shaped scales fail here, not in the engine
        out.append(KVConfig(f"fp8+{Path(path).name}", path, "fp8"))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise SpecError("QualitySpec", "scale_sets", list(scale_sets), "folders with distinct names")
    return tuple(out)


@dataclass(frozen=True)
class QualitySpec:
    """Everything Study 03 runs, from the notebook's parameters.

    Lengths are in tokens. ``tokenizer``: None = the model's own (a folder for models shipped without
    one). ``max_prompts_per_category``: None = every prompt of the set. ``top_k``: logprobs returned per
    position (greedy and teacher phases). Copy task: ``task_items`` passages of ``task_context_tokens``
    held-out tokens; a ``task_cue_tokens`` span from inside the passage is repeated at the end and the
    model must continue it with the next ``task_answer_tokens`` tokens of the passage.
    """

    model: str = str(TINY_MODEL_DIR)
    tokenizer: str | None = None
    prompts: str = str(DEFAULT_PROMPTS)
    max_prompts_per_category: int | None = None
    kv_dtypes: tuple[str, ...] = ("auto", "fp8", "fp8_e5m2")
    scale_sets: tuple[str, ...] = ()
    gen_tokens: int = 32
    top_k: int = 5
    ppl_windows: int = 8
    ppl_window_tokens: int = 512
    task_items: int = 16
    task_context_tokens: int = 256
    task_cue_tokens: int = 8
    task_answer_tokens: int = 8
    kv_cache_gib: float | None = 1.0
    max_model_len: int | None = 2048
    attention_backend: str | None = None
    seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", check_model_folder(self, "model", self.model))
        object.__setattr__(self, "tokenizer", check_tokenizer(self, self.tokenizer, self.model))
        object.__setattr__(
            self, "prompts", check_file(self, "prompts", self.prompts, 'a JSONL file of {"id", "category", "text"}')
        )
        check_int(self, "max_prompts_per_category", self.max_prompts_per_category, 1, 100_000, optional=True)
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "scale_sets", tuple(str(s) for s in self.scale_sets))
        for d in self.kv_dtypes:
            check_choice(self, "kv_dtypes", d, KVDtype)
        check_int(self, "gen_tokens", self.gen_tokens, REPORT_N_TOKENS, 4096)
        check_int(self, "top_k", self.top_k, 1, 20)
        check_int(self, "ppl_windows", self.ppl_windows, 0, 100_000)
        check_int(self, "ppl_window_tokens", self.ppl_window_tokens, 2, 1_000_000)
        check_int(self, "task_items", self.task_items, 0, 100_000)
        check_int(self, "task_cue_tokens", self.task_cue_tokens, 1, 10_000)
        check_int(self, "task_answer_tokens", self.task_answer_tokens, 1, 10_000)
        check_int(
            self,
            "task_context_tokens",
            self.task_context_tokens,
            self.task_cue_tokens + self.task_answer_tokens + 1,
            1_000_000,
        )
        check_float(self, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)
        kv_configs(self.model, self.kv_dtypes, self.scale_sets)  # validates labels and scale sets

    #: Notebook parameter name -> field (the notebook's ``parameters`` cell uses these names).
    PARAMS = {
        "MODEL": "model",
        "TOKENIZER": "tokenizer",
        "PROMPTS": "prompts",
        "MAX_PROMPTS_PER_CATEGORY": "max_prompts_per_category",
        "KV_DTYPES": "kv_dtypes",
        "SCALE_SETS": "scale_sets",
        "GEN_TOKENS": "gen_tokens",
        "TOP_K": "top_k",
        "PPL_WINDOWS": "ppl_windows",
        "PPL_WINDOW_TOKENS": "ppl_window_tokens",
        "TASK_ITEMS": "task_items",
        "TASK_CONTEXT_TOKENS": "task_context_tokens",
        "TASK_CUE_TOKENS": "task_cue_tokens",
        "TASK_ANSWER_TOKENS": "task_answer_tokens",
        "KV_CACHE_GIB": "kv_cache_gib",
        "MAX_MODEL_LEN": "max_model_len",
        "ATTENTION_BACKEND": "attention_backend",
        "SEED": "seed",
    }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> QualitySpec:
        """A spec from notebook parameters (``MODEL``, ``KV_DTYPES``, ... see :attr:`PARAMS`); other keys
        are ignored, missing ones take the field defaults. Lists become tuples."""
        kw = {
            f: (tuple(params[n]) if isinstance(params[n], list) else params[n])
            for n, f in cls.PARAMS.items()
            if n in params
        }
        return cls(**kw)

    @property
    def configs(self) -> tuple[KVConfig, ...]:
        return kv_configs(self.model, self.kv_dtypes, self.scale_sets)

    def scale_set_map(self) -> dict[str, str]:
        """``{label: model folder}`` of the scale sets (for :func:`roundtrip_table`)."""
        return {c.label: c.model for c in self.configs if c.model != self.model}

    def engine_spec(self, cfg: KVConfig) -> EngineSpec:
        """Token-id prompts only, so the engine never needs the tokenizer (``skip_tokenizer_init``)."""
        return EngineSpec(
            model=cfg.model,
            kv_cache_dtype=cfg.kv_cache_dtype,
            kv_cache_gib=self.kv_cache_gib,
            max_model_len=self.max_model_len,
            skip_tokenizer_init=True,
            seed=self.seed,
            attention_backend=self.attention_backend,
            timeout_s=self.timeout_s,
        )


# ============================================================================ inputs
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_prompt_set(path: str | Path, tokenizer: str, max_per_category: int | None = None) -> pd.DataFrame:
    """The prompt set as a DataFrame: ``id, category, text, token_ids, n_tokens`` (file order; at most
    ``max_per_category`` per category, the first ones)."""
    rows = []
    for i, ln in enumerate(
        read_text("PromptSet", "path", path, 'a UTF-8 JSONL file of {"id", "category", "text"}').splitlines()
    ):
        if ln.strip():
            try:
                rows.append(json.loads(ln))
            except ValueError as err:
                raise SpecError("PromptSet", f"line {i + 1}", ln[:80], f"one JSON object per line ({err})") from None
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise SpecError("PromptSet", f"line {i + 1}", r, 'a JSON object with "id", "category", "text"')
        missing = {"id", "category", "text"} - set(r)
        if missing:
            raise SpecError("PromptSet", f"line {i + 1}", sorted(missing), 'objects with "id", "category", "text"')
    df = pd.DataFrame(rows)[["id", "category", "text"]]
    dup = df.id[df.id.duplicated()].tolist()
    if dup:
        raise SpecError("PromptSet", "id", dup[0], "unique ids (each prompt's results are keyed by its id)")
    if max_per_category is not None:
        df = df.groupby("category", sort=False).head(max_per_category).reset_index(drop=True)
    tok = _tokenizer(tokenizer)
    df["token_ids"] = [tuple(tok.encode(t, add_special_tokens=False)) for t in df.text]
    df["n_tokens"] = df.token_ids.map(len)
    return df


def ppl_windows(tokenizer: str, n: int, length: int) -> list[tuple[int, ...]]:
    """``n`` consecutive, non-overlapping held-out windows of ``length`` tokens (``workloads.text_prompt``)."""
    from fp8lab.workloads import text_prompt

    return [text_prompt(tokenizer, length, offset=i * length) for i in range(n)]


@dataclass(frozen=True)
class CopyItem:
    """One copy-task item: ``prompt`` = passage + cue, ``answer`` = the passage's next tokens after the
    cue's first occurrence; ``depth`` = tokens from the answer's source to the end of the prompt."""

    tag: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    depth: int


def copy_task_items(
    tokenizer: str, n: int, context_tokens: int, cue_tokens: int, answer_tokens: int, offset: int = 0, seed: int = 0
) -> list[CopyItem]:
    """``n`` items from held-out passages starting at token ``offset`` (after the perplexity windows).
    The cue's start is drawn uniformly (seeded) among spans that occur once in the passage, so the
    answer is well defined; a passage without such a span is skipped."""
    from fp8lab.workloads import text_prompt

    rng = random.Random(seed)
    items: list[CopyItem] = []
    i = 0
    while len(items) < n and i < 4 * n + 8:
        passage = text_prompt(tokenizer, context_tokens, offset=offset + i * context_tokens)
        i += 1
        spans = [tuple(passage[j : j + cue_tokens]) for j in range(context_tokens - cue_tokens + 1)]
        counts: dict[tuple[int, ...], int] = {}
        for s in spans:
            counts[s] = counts.get(s, 0) + 1
        starts = [j for j in range(context_tokens - cue_tokens - answer_tokens + 1) if counts[spans[j]] == 1]
        if not starts:
            continue
        c = rng.choice(starts)
        cue, ans = passage[c : c + cue_tokens], passage[c + cue_tokens : c + cue_tokens + answer_tokens]
        items.append(
            CopyItem(
                f"copy-{len(items):03d}",
                tuple(passage) + tuple(cue),
                tuple(ans),
                depth=context_tokens - (c + cue_tokens) + cue_tokens,
            )
        )
    return items


def greedy_phase(prompts: pd.DataFrame, spec: QualitySpec) -> Phase:
    return Phase(
        "greedy",
        tuple(
            Request(prompt_token_ids=ids, max_tokens=spec.gen_tokens, logprobs=spec.top_k, cls=cat, tag=pid)
            for pid, cat, ids in zip(prompts.id, prompts.category, prompts.token_ids, strict=True)
        ),
    )


def teacher_phase(prompts: pd.DataFrame, continuations: Mapping[str, Sequence[int]], spec: QualitySpec) -> Phase:
    """Prompt + the baseline's continuation, scored in one prefill (``max_tokens=1``, ``prompt_logprobs``)."""
    return Phase(
        "teacher",
        tuple(
            Request(
                prompt_token_ids=tuple(ids) + tuple(_ids(continuations[pid])),
                max_tokens=1,
                prompt_logprobs=spec.top_k,
                cls=cat,
                tag=pid,
            )
            for pid, cat, ids in zip(prompts.id, prompts.category, prompts.token_ids, strict=True)
        ),
    )


def ppl_phase(windows: Sequence[Sequence[int]]) -> Phase:
    return Phase(
        "ppl",
        tuple(
            Request(prompt_token_ids=tuple(w), max_tokens=1, prompt_logprobs=0, cls="ppl", tag=f"w{i:03d}")
            for i, w in enumerate(windows)
        ),
    )


def task_phase(items: Sequence[CopyItem]) -> Phase:
    """The copy task, greedy: generate exactly as many tokens as the answer has."""
    return Phase(
        "task",
        tuple(Request(prompt_token_ids=it.prompt, max_tokens=len(it.answer), cls="copy", tag=it.tag) for it in items),
    )


def task_tf_phase(items: Sequence[CopyItem]) -> Phase:
    """The copy task, teacher-forced: prompt + answer scored in one prefill (top-1 and the answer's logprobs)."""
    return Phase(
        "task_tf",
        tuple(
            Request(prompt_token_ids=it.prompt + it.answer, max_tokens=1, prompt_logprobs=1, cls="copy", tag=it.tag)
            for it in items
        ),
    )


def study_phases(
    spec: QualitySpec,
    prompts: pd.DataFrame,
    continuations: Mapping[str, Sequence[int]],
    windows: Sequence[Sequence[int]],
    task: Sequence[CopyItem],
) -> list[Phase]:
    """The phases every measured KV config runs, in order: greedy, teacher, ppl (if windows), task and
    task_tf (if items). ``continuations``: the reference run's greedy tokens per prompt id."""
    phases = [greedy_phase(prompts, spec), teacher_phase(prompts, continuations, spec)]
    if windows:
        phases.append(ppl_phase(windows))
    if task:
        phases += [task_phase(task), task_tf_phase(task)]
    return phases


# ============================================================================ running
@dataclass
class QualityRuns:
    """The runs of one study: the reference ``auto`` run and one measured run per KV config."""

    spec: QualitySpec
    configs: tuple[KVConfig, ...]
    prompts: pd.DataFrame
    reference: Any
    results: dict[str, Any]
    windows: list[tuple[int, ...]] = field(default_factory=list)
    task: list[CopyItem] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)  # what every measured config ran (add configs with these)
    notes: list[str] = field(default_factory=list)  # what was not measured natively and why (fp8lab.capability)

    @property
    def ok_labels(self) -> list[str]:
        return [c.label for c in self.configs if self.results[c.label].ok]

    def records(self, label: str, phase: str) -> pd.DataFrame:
        r = self.results[label].records
        return r[r.phase == phase].set_index("tag") if len(r) else pd.DataFrame()

    def reference_outputs(self) -> dict[str, list[int]]:
        r = self.reference.records
        return {t: _ids(ids) for t, ids in zip(r.tag, r.output_token_ids, strict=True)}

    def status_table(self) -> pd.DataFrame:
        """One row per engine run: label, dtype, model, status (a failure keeps its reason), timings."""
        rows = []
        for lab, res in [("auto (reference)", self.reference)] + [
            (c.label, self.results[c.label]) for c in self.configs
        ]:
            e = res.engine or {}
            rows.append(
                {
                    "label": lab,
                    "kv_cache_dtype": res.spec.kv_cache_dtype if res.spec else None,
                    "model": Path(res.spec.model).name if res.spec else None,
                    "status": res.status,
                    "error": res.error,
                    "engine_start_s": e.get("engine_start_s"),
                    "run_wall_s": e.get("run_wall_s"),
                    "num_blocks": e.get("num_blocks"),
                    "cached": bool(res.extra.get("cached")),
                    "run_dir": str(res.run_dir),
                    # an emulated run's engine had an auto cache holding FP8-rounded K/V (fp8lab.fp8emu)
                    "fp8_emulation": res.extra.get("emulated"),
                }
            )
        return pd.DataFrame(rows)


def run_quality(spec: QualitySpec, study: str = "03_quality", progress: bool = True) -> QualityRuns:
    """Run (or load from the results store) every engine of the study; see the module docstring.

    A failing candidate config is kept with its status and reason; a failing baseline raises.
    """
    from fp8lab.results import run_cached

    def log(msg: str) -> None:
        if progress:
            print(msg, flush=True)

    configs = spec.configs
    prompts = load_prompt_set(spec.prompts, spec.tokenizer, spec.max_prompts_per_category)
    windows = ppl_windows(spec.tokenizer, spec.ppl_windows, spec.ppl_window_tokens)
    task = copy_task_items(
        spec.tokenizer,
        spec.task_items,
        spec.task_context_tokens,
        spec.task_cue_tokens,
        spec.task_answer_tokens,
        offset=spec.ppl_windows * spec.ppl_window_tokens,
        seed=spec.seed,
    )
    greedy = greedy_phase(prompts, spec)
    t0 = time.perf_counter()
    ref = run_cached(spec.engine_spec(configs[0]), [greedy], study=study)
    log(
        f"[reference auto] {ref.status} in {time.perf_counter() - t0:.0f} s{' (cached)' if ref.extra.get('cached') else ''}"
    )
    if not ref.ok:
        raise RuntimeError(f"the baseline (auto) failed: {ref.status}: {ref.error}")
    conts = {t: _ids(ids) for t, ids in zip(ref.records.tag, ref.records.output_token_ids, strict=True)}
    phases = study_phases(spec, prompts, conts, windows, task)
    from fp8lab import fp8emu
    from fp8lab.capability import emulation_note, kv_support

    results = {}
    ran, emulated, reasons = [], [], []
    for cfg in configs:
        t0 = time.perf_counter()
        sup = kv_support(cfg.kv_cache_dtype, cfg.model)
        if not sup.native and sup.emulated:  # no FP8 kernel here: the same engine, FP8-rounded K/V (fp8emu)
            cfg = KVConfig(fp8emu.emulated_label(cfg.label), cfg.model, cfg.kv_cache_dtype)
            res = fp8emu.run_emulated(
                spec.engine_spec(cfg),
                phases,
                study=study,
                base_model=spec.model,
                scale_set=cfg.model if cfg.model != spec.model else None,
            )
            emulated.append(cfg.label)
            reasons.append(sup.reason)
        else:
            res = run_cached(spec.engine_spec(cfg), phases, study=study)
        ran.append(cfg)
        results[cfg.label] = res
        log(
            f"[{cfg.label}] {res.status} in {time.perf_counter() - t0:.0f} s"
            f"{' (cached)' if res.extra.get('cached') else ''}{': ' + str(res.error) if not res.ok else ''}"
        )
    if not results[BASELINE].ok:
        raise RuntimeError(f"the baseline (auto) failed: {results[BASELINE].status}: {results[BASELINE].error}")
    notes = [emulation_note(emulated, reasons[0])] if emulated else []
    return QualityRuns(spec, tuple(ran), prompts, ref, results, windows, task, phases, notes)


# ============================================================================ tables
def greedy_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (label, prompt): ``top3_match`` (the reports' protocol), ``prefix_len``,
    ``first_div`` (NaN when never diverged), ``first_div_censored`` (never diverged = gen_tokens),
    ``agreement``, and ``max_abs_dlogprob`` (|delta| of the chosen tokens' logprobs over the
    identical prefix, where both engines saw the same context). All against the reference run."""
    ref_rec = runs.reference.records.set_index("tag")
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, "greedy")
        for pid, cat in zip(runs.prompts.id, runs.prompts.category, strict=True):
            ref_ids, ids = _ids(ref_rec.output_token_ids[pid]), _ids(rec.output_token_ids[pid])
            n = identical_prefix_len(ref_ids, ids)
            fd = first_divergence(ref_ids, ids)
            d = np.abs(
                np.asarray(list(rec.output_token_logprobs[pid])[:n], dtype=float)
                - np.asarray(list(ref_rec.output_token_logprobs[pid])[:n], dtype=float)
            )
            rows.append(
                {
                    "label": lab,
                    "prompt": pid,
                    "category": cat,
                    "top3_match": token_match_fraction(ref_ids, ids, REPORT_N_TOKENS),
                    "prefix_len": n,
                    "first_div": float("nan") if fd is None else fd,
                    "first_div_censored": len(ref_ids) if fd is None else fd,
                    "agreement": agreement_rate(ref_ids, ids),
                    "max_abs_dlogprob": float(d.max()) if d.size else 0.0,
                }
            )
    return pd.DataFrame(rows)


def top3_by_category(greedy: pd.DataFrame, threshold: float = REPORT_THRESHOLD) -> pd.DataFrame:
    """Mean top-3 match per label and category (plus ``all``), and whether it clears ``threshold``."""
    per = greedy.pivot_table(index="label", columns="category", values="top3_match", aggfunc="mean", sort=False)
    per["all"] = greedy.groupby("label", sort=False).top3_match.mean()
    per.columns.name = None
    per[f"all >= {threshold}"] = per["all"] >= threshold
    return per


def teacher_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (candidate label, prompt, position >= 1) of the teacher-forced sequences.

    ``segment``: ``prompt`` or ``continuation`` (the baseline's greedy tokens); ``top{k}``: top-k
    overlap with the baseline for k = 1..top_k; ``abs_dlogprob``: |delta logprob| of the actual token
    (nats); ``kl``: :func:`kl_topk` lower bound of KL(P_auto || P_candidate) (nats).
    """
    k_max = runs.spec.top_k
    base = runs.records(BASELINE, "teacher")
    plen = dict(zip(runs.prompts.id, runs.prompts.n_tokens, strict=True))
    conts = runs.reference_outputs()
    seqs = {pid: list(ids) + conts[pid] for pid, ids in zip(runs.prompts.id, runs.prompts.token_ids, strict=True)}
    rows = []
    for lab in runs.ok_labels:
        if lab == BASELINE:
            continue
        rec = runs.records(lab, "teacher")
        for pid, cat in zip(runs.prompts.id, runs.prompts.category, strict=True):
            b, c = base.loc[pid], rec.loc[pid]
            bl, cl = list(b.prompt_token_logprobs), list(c.prompt_token_logprobs)
            bi, ci = list(b.prompt_topk_ids), list(c.prompt_topk_ids)
            blp, clp = list(b.prompt_topk_logprobs), list(c.prompt_topk_logprobs)
            for pos in range(1, len(bl)):
                p = dict(zip(_ids(bi[pos]), map(float, blp[pos]), strict=True))
                q = dict(zip(_ids(ci[pos]), map(float, clp[pos]), strict=True))
                tok = seqs[pid][pos]  # the actual token: both engines return its logprob, in the top-k or not
                p[tok], q[tok] = float(bl[pos]), float(cl[pos])
                row = {
                    "label": lab,
                    "prompt": pid,
                    "category": cat,
                    "pos": pos,
                    "segment": "prompt" if pos < plen[pid] else "continuation",
                    "abs_dlogprob": abs(float(cl[pos]) - float(bl[pos])),
                    "kl": kl_topk(p, q),
                }
                for k in range(1, k_max + 1):
                    row[f"top{k}"] = topk_overlap(bi[pos], ci[pos], k)
                rows.append(row)
    return pd.DataFrame(rows)


def by_position(
    teacher: pd.DataFrame,
    bin_tokens: int = 16,
    metrics: Sequence[str] = ("top1", "abs_dlogprob", "kl"),
    min_prompts: int = 5,
) -> pd.DataFrame:
    """Teacher-forced metrics averaged per label and context-position bin (``pos_bin`` = bin start);
    ``n`` positions and ``prompts`` contributing per bin; bins with fewer than ``min_prompts`` prompts
    (the tail that only the longest prompts reach) are dropped."""
    t = teacher.assign(pos_bin=(teacher.pos // bin_tokens) * bin_tokens)
    g = t.groupby(["label", "pos_bin"], sort=True)
    out = g[list(metrics)].mean().assign(n=g.size(), prompts=g.prompt.nunique()).reset_index()
    return out[out.prompts >= min_prompts].reset_index(drop=True)


def topk_curve(teacher: pd.DataFrame, segment: str | None = "continuation") -> pd.DataFrame:
    """Mean top-k overlap per label for k = 1..K (long format: label, k, overlap)."""
    t = teacher if segment is None else teacher[teacher.segment == segment]
    cols = [c for c in t.columns if c.startswith("top") and c[3:].isdigit()]
    m = t.groupby("label", sort=False)[cols].mean().reset_index()
    long = m.melt(id_vars="label", var_name="k", value_name="overlap")
    long["k"] = long.k.str[3:].astype(int)
    return long


def ppl_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (label, window): ``n_tokens`` scored (all but the first), ``nll`` (nats, summed), ``ppl``."""
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, "ppl")
        for tag, lps in zip(rec.index, rec.prompt_token_logprobs, strict=True):
            a = np.asarray(list(lps), dtype=float)
            a = a[np.isfinite(a)]
            rows.append({"label": lab, "window": tag, "n_tokens": a.size, "nll": float(-a.sum()), "ppl": perplexity(a)})
    return pd.DataFrame(rows)


def ppl_by_label(ppl: pd.DataFrame) -> pd.DataFrame:
    """Token-weighted perplexity per label over all windows: ``n_tokens``, ``nll`` (nats), ``ppl``."""
    g = ppl.groupby("label", sort=False)[["n_tokens", "nll"]].sum()
    return g.assign(ppl=np.exp(g.nll / g.n_tokens))


def task_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (label, copy item). Greedy: ``token_acc`` (fraction of answer tokens right, position
    by position; one miss can derail the rest), ``exact`` (all right). Teacher-forced (no cascade):
    ``tf_acc`` (fraction of answer positions whose top-1 is the right token given the right prefix),
    ``answer_logprob`` (mean logprob of the answer tokens, nats: a continuous score). ``depth``: tokens
    between the answer's source and the end of the prompt."""
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, "task")
        tf = runs.records(lab, "task_tf")
        for it in runs.task:
            out = _ids(rec.output_token_ids[it.tag])
            acc = agreement_rate(it.answer, out)
            row = {"label": lab, "item": it.tag, "depth": it.depth, "token_acc": acc, "exact": acc == 1.0}
            if len(tf):
                n = len(it.prompt)
                lps = np.asarray(list(tf.prompt_token_logprobs[it.tag])[n:], dtype=float)
                top1 = [_ids(t)[:1] for t in list(tf.prompt_topk_ids[it.tag])[n:]]
                row["tf_acc"] = float(np.mean([t == [a] for t, a in zip(top1, it.answer, strict=True)]))
                row["answer_logprob"] = float(lps.mean())
            rows.append(row)
    return pd.DataFrame(rows)


def summary_table(
    runs: QualityRuns, greedy: pd.DataFrame, teacher: pd.DataFrame, ppl: pd.DataFrame, task: pd.DataFrame
) -> pd.DataFrame:
    """One row per label: the headline numbers (see the column names; ``tf_*`` are over the
    continuation positions; ``ci_*`` are 95% bootstrap intervals over prompts / items)."""
    rows = []
    base_ppl = None
    for cfg in runs.configs:
        lab, res = cfg.label, runs.results[cfg.label]
        row: dict[str, Any] = {"label": lab, "kv_cache_dtype": cfg.kv_cache_dtype, "status": res.status}
        if res.ok:
            g = greedy[greedy.label == lab]
            row.update(
                top3_match=g.top3_match.mean(),
                top3_ci=bootstrap_mean_ci(g.top3_match, seed=runs.spec.seed),
                first_div_median=float(np.median(g.first_div_censored)),
                never_diverged=float(g.first_div.isna().mean()),
                prefix_len_mean=g.prefix_len.mean(),
                agreement=g.agreement.mean(),
            )
            t = teacher[(teacher.label == lab) & (teacher.segment == "continuation")] if len(teacher) else teacher
            if len(t):
                row.update(
                    tf_top1=t.top1.mean(),
                    tf_topk=t[f"top{runs.spec.top_k}"].mean(),
                    tf_abs_dlogprob=t.abs_dlogprob.mean(),
                    tf_kl=t.kl.mean(),
                    tf_abs_dlogprob_p99=float(t.abs_dlogprob.quantile(0.99)),
                )
            p = ppl[ppl.label == lab]
            if len(p):
                row["ppl"] = math.exp(p.nll.sum() / p.n_tokens.sum())
                if lab == BASELINE:
                    base_ppl = row["ppl"]
            k = task[task.label == lab]
            if len(k):
                row.update(
                    task_acc=k.token_acc.mean(),
                    task_exact=k.exact.mean(),
                    task_ci=bootstrap_mean_ci(k.token_acc, seed=runs.spec.seed),
                )
                if "tf_acc" in k:
                    row.update(task_tf_acc=k.tf_acc.mean(), task_answer_logprob=k.answer_logprob.mean())
        rows.append(row)
    df = pd.DataFrame(rows).set_index("label")
    seed = runs.spec.seed
    pb = ppl[ppl.label == BASELINE].set_index("window") if len(ppl) else None
    kb = task[task.label == BASELINE].set_index("item") if len(task) else None
    ppl_ci: dict[str, Any] = {}
    task_ci: dict[str, Any] = {}
    task_lp_ci: dict[str, Any] = {}
    for lab in df.index:
        if lab == BASELINE or df.loc[lab, "status"] != "ok":
            continue
        if pb is not None and len(pb):  # paired by window
            pc = ppl[ppl.label == lab].set_index("window").loc[pb.index]
            b, c, n = pb.nll.to_numpy(), pc.nll.to_numpy(), pb.n_tokens.to_numpy()
            ppl_ci[lab] = bootstrap_ci(lambda i, b=b, c=c, n=n: delta_ppl_pct(b[i], c[i], n[i]), len(b), seed=seed)
        if kb is not None and len(kb):  # paired by item
            kc = task[task.label == lab].set_index("item").loc[kb.index]
            task_ci[lab] = bootstrap_mean_ci((kc.token_acc - kb.token_acc).to_numpy(), seed=seed)
            if "answer_logprob" in kc:
                task_lp_ci[lab] = bootstrap_mean_ci((kc.answer_logprob - kb.answer_logprob).to_numpy(), seed=seed)
    df["delta_ppl_pct_ci"] = pd.Series(ppl_ci, dtype=object).reindex(df.index)
    df["delta_task_acc_ci"] = pd.Series(task_ci, dtype=object).reindex(df.index)
    df["delta_task_answer_logprob_ci"] = pd.Series(task_lp_ci, dtype=object).reindex(df.index)
    if base_ppl is not None and "ppl" in df:
        df["delta_ppl"] = df.ppl - base_ppl
        df["delta_ppl_pct"] = 100 * df.delta_ppl / base_ppl  # equals delta_ppl_pct() of the windows' nll
    for col in ("task_acc", "task_tf_acc", "task_answer_logprob"):
        if col in df:
            df[f"delta_{col}"] = df[col] - df[col].get(BASELINE, float("nan"))
    return df


# ============================================================================ numerics: round trip
def _scale_for(name: Any, x: Any, fmt: Any, layer: int, tensor: str, set_scales: Mapping | None) -> Any:
    """A round trip's scale: a number, ``amax`` (this tensor's max |x| / format max, per layer; the
    best per-tensor scale for this data), or a scale set's per-layer (per-head) k/v scale."""
    if set_scales is not None:
        k, v = set_scales[layer]
        s = k if tensor == "K" else v
        return s.view(1, -1, 1) if s.numel() > 1 else float(s)
    if name == "amax":
        return max(float(x.abs().max()), 1e-12) / fmt.max
    if isinstance(name, (int, float)) and not isinstance(name, bool) and name > 0:
        return float(name)
    raise SpecError("roundtrip_table", "scales", name, "positive numbers or 'amax'")


def roundtrip_table(
    capture: Any,
    formats: Sequence[str] = ("e4m3", "e5m2"),
    roundings: Sequence[str] = ("rne", "rtz"),
    scales: Sequence[Any] = (1.0, "amax"),
    scale_sets: Mapping[str, str] | None = None,
    tensors: Sequence[str] = ("K", "V", "Q"),
) -> pd.DataFrame:
    """Round-trip the captured tensors through every format x rounding x scale: one row per
    (layer, tensor, format, rounding, scale) with :func:`fp8formats.error_stats` columns plus
    ``sq_err``/``sq_norm`` (for pooling over layers) and ``rtz_rne_differ`` (share of values where the
    two roundings store different numbers). ``scale_sets``: ``{label: model folder}``; their k/v
    scales are used for K and V (Q has none: skipped).
    """
    import torch

    from fp8lab import fp8formats as ff
    from fp8lab.kvcapture import read_kv_scales

    sets = {lab: read_kv_scales(p) for lab, p in (scale_sets or {}).items()}
    rows = []
    for tensor in tensors:
        if tensor == "Q" and not capture.queries:
            continue
        for layer in range(capture.num_layers):
            x = capture.tensor(tensor, layer).float()
            for fname in formats:
                fmt = ff.get_format(fname)
                choices = [(str(s), s, None) for s in scales] + [(lab, None, sc) for lab, sc in sets.items()]
                for sname, s, set_scales in choices:
                    if set_scales is not None and tensor == "Q":
                        continue
                    scale = _scale_for(s, x, fmt, layer, tensor, set_scales)
                    enc = {}
                    for rnd in roundings:
                        enc[rnd] = ff.encode(x, fmt, rnd, scale)
                        y = enc[rnd] * torch.as_tensor(scale, dtype=torch.float32)
                        st = ff.error_stats(x, y, fmt, scale)
                        d = (y - x).double()
                        rows.append(
                            {
                                "layer": layer,
                                "tensor": tensor,
                                "format": fname,
                                "rounding": rnd,
                                "scale": sname,
                                "scale_value": float(torch.as_tensor(scale).float().mean()),
                                **st,
                                "sq_err": float((d * d).sum()),
                                "sq_norm": float((x.double() ** 2).sum()),
                            }
                        )
                    if "rne" in enc and "rtz" in enc:
                        frac = float((enc["rne"] != enc["rtz"]).float().mean())
                        for r in rows[-len(roundings) :]:
                            r["rtz_rne_differ"] = frac
    return pd.DataFrame(rows)


def roundtrip_summary(rt: pd.DataFrame) -> pd.DataFrame:
    """Pooled over layers: ``rel_err = sqrt(Σ sq_err / Σ sq_norm)``, mean ``mag_bias``, max ``sat_frac``,
    mean ``zero_frac``; one row per (tensor, format, rounding, scale)."""
    keys = ["tensor", "format", "rounding", "scale"]
    g = rt.groupby(keys, sort=False)
    out = pd.DataFrame(
        {
            "rel_err": np.sqrt(g.sq_err.sum() / g.sq_norm.sum()),
            "mag_bias": g.mag_bias.mean(),
            "zero_frac": g.zero_frac.mean(),
            "sat_frac": g.sat_frac.max(),
            "amax": g.amax.max(),
        }
    )
    if "rtz_rne_differ" in rt:
        out["rtz_rne_differ"] = g.rtz_rne_differ.mean()
    return out.reset_index()


def capture_prompts(prompts: pd.DataFrame, n: int) -> list[tuple[int, ...]]:
    """``n`` prompts' token ids for a K/V capture, taken round-robin over the categories (file order)."""
    groups = [list(g.token_ids) for _, g in prompts.groupby("category", sort=False)]
    out: list[tuple[int, ...]] = []
    i = 0
    while len(out) < n and any(i < len(g) for g in groups):
        out.extend(g[i] for g in groups if i < len(g))
        i += 1
    return out[:n]


def roundtrip_points(
    capture: Any,
    layer: int = 0,
    tensor: str = "K",
    formats: Sequence[str] = ("e4m3", "e5m2"),
    roundings: Sequence[str] = ("rne", "rtz"),
    scale: float = 1.0,
    n: int = 4000,
    seed: int = 0,
) -> pd.DataFrame:
    """A seeded sample of ``n`` values of one captured tensor and their round-trip error, long format:
    ``format, rounding, x`` (true value), ``err`` (stored minus true), for :func:`plots_quality.roundtrip_points`."""
    import torch

    from fp8lab import fp8formats as ff

    x = capture.tensor(tensor, layer).float().reshape(-1)
    idx = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:n]
    x = x[idx]
    frames = []
    for f in formats:
        for r in roundings:
            y = ff.roundtrip(x, f, r, scale)
            frames.append(pd.DataFrame({"format": f, "rounding": r, "x": x.numpy(), "err": (y - x).numpy()}))
    return pd.concat(frames, ignore_index=True)


def _attention(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """Causal GQA attention in float32: q ``[T, H, D]``, k/v ``[T, H_kv, D]`` -> (out ``[T, H, D]``,
    probs ``[H, T, T]``). Query head h reads KV head ``h // (H / H_kv)`` (transformers' repeat_kv)."""
    import torch

    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,shd->hts", q, kk) * scale
    t = q.shape[0]
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hts,shd->thd", p, vv), p


def attention_error_table(
    capture: Any,
    formats: Sequence[str] = ("e4m3",),
    roundings: Sequence[str] = ("rne", "rtz"),
    quantize_q: Sequence[bool] = (False, True),
    scale: float = 1.0,
) -> pd.DataFrame:
    """What the round trip does to attention itself, layer by layer, on the captured Q/K/V.

    One row per (format, rounding, quantize_q, layer): ``out_rel_err`` = ||O_fp8 - O|| / ||O|| of the
    attention outputs (before o_proj), ``prob_tv`` = mean total-variation distance between the
    attention distributions of each query (0..1). ``quantize_q`` adds a round trip of Q through the
    same format (FA3 on Hopper does this; CPU does not: vllm-notes section 6).
    """
    from fp8lab import fp8formats as ff

    if not capture.queries:
        raise SpecError("attention_error_table", "capture", "no queries", "a capture made with with_queries=True")
    sm = capture.head_dim**-0.5
    bounds = np.cumsum([0] + list(capture.seq_lens))
    split = lambda t: [t[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]  # noqa: E731
    rows = []
    for layer in range(capture.num_layers):
        q_all, k_all, v_all = (capture.tensor(n, layer).float() for n in ("Q", "K", "V"))
        refs = [_attention(q, k, v, sm) for q, k, v in zip(split(q_all), split(k_all), split(v_all), strict=True)]
        for fname in formats:
            for rnd in roundings:
                kq, vq = split(ff.roundtrip(k_all, fname, rnd, scale)), split(ff.roundtrip(v_all, fname, rnd, scale))
                qs = {False: split(q_all), True: split(ff.roundtrip(q_all, fname, rnd, scale))}
                for qq in quantize_q:
                    num = den = tv = n = 0.0
                    for q, k, v, (o_ref, p_ref) in zip(qs[qq], kq, vq, refs, strict=True):
                        o, p = _attention(q, k, v, sm)
                        num += float(((o - o_ref) ** 2).sum())
                        den += float((o_ref**2).sum())
                        tv += float(0.5 * (p - p_ref).abs().sum(-1).sum())
                        n += p.shape[0] * p.shape[1]
                    rows.append(
                        {
                            "format": fname,
                            "rounding": rnd,
                            "quantize_q": qq,
                            "layer": layer,
                            "out_rel_err": math.sqrt(num / den) if den else float("nan"),
                            "prob_tv": tv / n,
                        }
                    )
    return pd.DataFrame(rows)


def engine_roundtrip(
    rt_summary: pd.DataFrame, configs: Sequence[KVConfig], rounding: str, quantize_q: bool = False
) -> pd.DataFrame:
    """The round-trip rows that match what each KV config's engine does to K and V: its format
    (``fp8``/``fp8_e4m3`` -> e4m3, ``fp8_e5m2`` -> e5m2), the engine's ``rounding`` and its scale
    (1.0 without a scale set: vLLM's default; a scale set's own scales otherwise); with
    ``quantize_q`` (Hopper FA3) also Q's round trip at scale 1.0 (vLLM's uncalibrated q_scale)."""
    from fp8lab.fp8emu import configured_label
    from fp8lab.fp8formats import KV_DTYPE_FORMAT

    rows = []
    for c in configs:
        if c.kv_cache_dtype not in KV_DTYPE_FORMAT:
            continue
        own = configured_label(c.label)  # an emulated config rounds K and V as its native twin would
        scale = "1.0" if not own.startswith("fp8+") else own
        fmt = (rt_summary.format == KV_DTYPE_FORMAT[c.kv_cache_dtype]) & (rt_summary.rounding == rounding)
        sel = rt_summary[
            fmt
            & (
                ((rt_summary.scale == scale) & rt_summary.tensor.isin(["K", "V"]))
                | ((rt_summary.scale == "1.0") & (rt_summary.tensor == "Q") & quantize_q)
            )
        ]
        for _, r in sel.iterrows():
            rows.append(
                {
                    "label": c.label,
                    "tensor": r.tensor,
                    "format": r.format,
                    "rounding": rounding,
                    "scale": r.scale,
                    "rel_err": r.rel_err,
                    "mag_bias": r.mag_bias,
                }
            )
    return pd.DataFrame(rows)


def verdict_markdown(verdicts: Mapping[str, Mapping[str, Any]], notes: Sequence[str] = ()) -> str:
    """The verdicts as one Markdown block (a paragraph per candidate), after ``notes`` (what was not
    measured natively and why, :attr:`QualityRuns.notes`)."""
    return "\n\n".join([*notes, *(v["text"] for v in verdicts.values())]) or "No candidate KV config ran."


# ============================================================================ headline and verdict
@dataclass(frozen=True)
class VerdictRules:
    """Thresholds of :func:`verdict` (candidate vs baseline; task = the greedy copy-task accuracy).

    ``material``: perplexity worse by more than ``ppl_pct_bad`` % or task accuracy down by more than
    ``task_drop_bad``, **and** the 95% paired bootstrap interval of that delta excludes zero.
    ``negligible``: perplexity within ``ppl_pct_ok`` %, task accuracy down by at most ``task_drop_ok``
    and teacher-forced top-1 agreement at least ``tf_top1_ok``. Otherwise ``small``.
    """

    ppl_pct_ok: float = 1.0
    task_drop_ok: float = 0.02
    tf_top1_ok: float = 0.97
    ppl_pct_bad: float = 5.0
    task_drop_bad: float = 0.05


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _finite_ci(ci: Any) -> bool:
    return isinstance(ci, tuple) and len(ci) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in ci)


def _ci(ci: Any, fmt: str) -> str:
    if not _finite_ci(ci):
        return ""
    noise = " (within noise)" if ci[0] <= 0 <= ci[1] else ""
    return f", 95% CI {format(ci[0], fmt)} to {format(ci[1], fmt)}{noise}"


def verdict(
    summary: pd.DataFrame, rules: VerdictRules = VerdictRules(), threshold: float = REPORT_THRESHOLD
) -> dict[str, dict[str, Any]]:
    """Per candidate: ``level`` (negligible | small | material | failed, see :class:`VerdictRules`),
    ``report_protocol`` (pass | fail at ``threshold``) and a Markdown ``text`` quoting its numbers."""
    out: dict[str, dict[str, Any]] = {}
    for lab, r in summary.iterrows():
        if lab == BASELINE:
            continue
        if r.status != "ok":
            out[lab] = {
                "level": "failed",
                "report_protocol": "n/a",
                "text": f"**{lab}**: the engine did not run (status `{r.status}`); nothing measured.",
            }
            continue

        def g(name: str, r: pd.Series = r) -> Any:
            return r.get(name, float("nan"))

        dppl, dtask, top1 = g("delta_ppl_pct"), g("delta_task_acc"), g("tf_top1")
        dppl0 = dppl if math.isfinite(dppl) else 0.0
        drop0 = -dtask if math.isfinite(dtask) else 0.0
        ppl_ci, task_ci = g("delta_ppl_pct_ci"), g("delta_task_acc_ci")
        ppl_sig = not _finite_ci(ppl_ci) or ppl_ci[0] > 0  # no interval (one window): the point estimate decides
        task_sig = not _finite_ci(task_ci) or task_ci[1] < 0
        if (dppl0 > rules.ppl_pct_bad and ppl_sig) or (drop0 > rules.task_drop_bad and task_sig):
            level = "material"
        elif (
            abs(dppl0) <= rules.ppl_pct_ok
            and drop0 <= rules.task_drop_ok
            and (not math.isfinite(top1) or top1 >= rules.tf_top1_ok)
        ):
            level = "negligible"
        else:
            level = "small"
        rp = "pass" if g("top3_match") >= threshold else "fail"
        if g("never_diverged") >= 0.5:
            div = (
                f"{_f(100 * g('never_diverged'), '.0f')}% of the greedy texts never diverge within the generated tokens"
            )
        else:
            div = (
                f"greedy texts first diverge at token {_f(g('first_div_median'), '.0f')} (median; "
                f"{_f(100 * g('never_diverged'), '.0f')}% never)"
            )
        text = (
            f"**{lab}** (`{r.kv_cache_dtype}`): reports' top-3 match {_f(g('top3_match'), '.2f')} "
            f"({'≥' if rp == 'pass' else '<'} {threshold}: the reports' protocol would call it a "
            f"{'pass' if rp == 'pass' else 'failed calibration'}); {div}. "
            f"Teacher-forced: top-1 agreement {_f(top1)}, mean |Δlogprob| {_f(g('tf_abs_dlogprob'), '.4f')} nats, "
            f"KL ≥ {_f(g('tf_kl'), '.2e')} nats/token. Perplexity {_f(g('ppl'), '.3f')} "
            f"({'+' if dppl >= 0 else ''}{_f(dppl, '.2f')}%{_ci(ppl_ci, '.2f')}). Copy task: greedy accuracy "
            f"{_f(g('task_acc'))} (Δ {_f(dtask, '+.3f')}{_ci(task_ci, '+.3f')}), teacher-forced accuracy "
            f"{_f(g('task_tf_acc'))} (Δ {_f(g('delta_task_tf_acc'), '+.3f')}), answer logprob Δ "
            f"{_f(g('delta_task_answer_logprob'), '+.4f')} nats{_ci(g('delta_task_answer_logprob_ci'), '+.4f')}. "
            f"**Effect: {level}** (negligible: |Δppl| ≤ {rules.ppl_pct_ok}%, task drop ≤ {rules.task_drop_ok}, "
            f"top-1 ≥ {rules.tf_top1_ok}; material: Δppl > {rules.ppl_pct_bad}% or task drop > "
            f"{rules.task_drop_bad}, beyond noise)."
        )
        out[lab] = {"level": level, "report_protocol": rp, "text": text}
    return out


def headline(
    runs: QualityRuns,
    summary: pd.DataFrame,
    top3_cat: pd.DataFrame,
    greedy: pd.DataFrame,
    rt_summary: pd.DataFrame | None = None,
    attn: pd.DataFrame | None = None,
    verdicts: Mapping[str, Mapping[str, Any]] | None = None,
    engine_rt: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The flat ``{key: number}`` dict a notebook passes to ``report.record_summary``.

    Keys: ``<label>.<metric>`` per KV config (``top3_match``, ``top3_match.<category>``,
    ``first_div_median``, ``tf_top1``, ``tf_abs_dlogprob``, ``tf_kl``, ``ppl``, ``delta_ppl``,
    ``delta_ppl_pct``, ``task_acc``, ``verdict``...); ``auto.rerun_*`` (noise floor, auto vs the
    reference run); ``roundtrip.<tensor>.<format>.<rounding>.scale_<s>.rel_err``;
    ``attn_sim.<format>.<rounding>.<q|noq>.out_rel_err``; ``<label>.kv_roundtrip.<K|V>.rel_err`` (the
    round trip this engine applies, from :func:`engine_roundtrip`).
    """
    out: dict[str, Any] = {
        "baseline": BASELINE,
        "labels": [c.label for c in runs.configs],
        "n_prompts": len(runs.prompts),
        "categories": sorted(runs.prompts.category.unique()),
        "gen_tokens": runs.spec.gen_tokens,
        "report_threshold": REPORT_THRESHOLD,
        "model": Path(runs.spec.model).name,
    }
    if runs.notes:
        out["not_measured"] = " ".join(runs.notes)
    metrics = [
        "top3_match",
        "first_div_median",
        "never_diverged",
        "agreement",
        "tf_top1",
        "tf_topk",
        "tf_abs_dlogprob",
        "tf_kl",
        "ppl",
        "delta_ppl",
        "delta_ppl_pct",
        "task_acc",
        "task_exact",
        "delta_task_acc",
        "task_tf_acc",
        "delta_task_tf_acc",
        "task_answer_logprob",
        "delta_task_answer_logprob",
    ]
    for lab, r in summary.iterrows():
        out[f"{lab}.status"] = r.status
        for m in metrics:
            if m in r and r[m] is not None and not (isinstance(r[m], float) and math.isnan(r[m])):
                out[f"{lab}.{m}"] = float(r[m])
        for m in ("top3_ci", "delta_ppl_pct_ci", "delta_task_acc_ci", "delta_task_answer_logprob_ci"):
            ci = r.get(m)
            if _finite_ci(ci):
                out[f"{lab}.{m}_lo"], out[f"{lab}.{m}_hi"] = ci
        if lab in top3_cat.index:
            for cat in runs.prompts.category.unique():
                out[f"{lab}.top3_match.{cat}"] = float(top3_cat.loc[lab, cat])
    g = greedy[greedy.label == BASELINE]
    out["auto.rerun_top3_match"] = float(g.top3_match.mean())
    out["auto.rerun_max_abs_dlogprob"] = float(g.max_abs_dlogprob.max())
    if rt_summary is not None:
        for _, r in rt_summary.iterrows():
            out[f"roundtrip.{r.tensor}.{r.format}.{r.rounding}.scale_{r.scale}.rel_err"] = float(r.rel_err)
            out[f"roundtrip.{r.tensor}.{r.format}.{r.rounding}.scale_{r.scale}.mag_bias"] = float(r.mag_bias)
    if attn is not None:
        a = attn.groupby(["format", "rounding", "quantize_q"]).out_rel_err.mean()
        for (f, rnd, qq), v in a.items():
            out[f"attn_sim.{f}.{rnd}.{'q' if qq else 'noq'}.out_rel_err"] = float(v)
    if engine_rt is not None:
        for _, r in engine_rt.iterrows():
            out[f"{r.label}.kv_roundtrip.{r.tensor}.rel_err"] = float(r.rel_err)
            out[f"{r.label}.kv_roundtrip.{r.tensor}.mag_bias"] = float(r.mag_bias)
    for lab, v in (verdicts or {}).items():
        out[f"{lab}.verdict"] = v["level"]
        out[f"{lab}.report_protocol"] = v["report_protocol"]
    return out


def summary_rows(
    runs: QualityRuns, summary: pd.DataFrame, top3_cat: pd.DataFrame, greedy: pd.DataFrame, study: str = "quality"
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per KV config that ran
    (``setting`` its label: the dtype, or ``fp8+<scale set>``) the top-3 match over all prompts with its bootstrap
    CI (:func:`summary_table`) and per prompt category (``subset``, :func:`top3_by_category`), the first
    divergence, agreement, teacher-forced top-1 and KL, perplexity and the copy task's accuracy; per candidate the
    perplexity change (% paired by window) and the accuracy change (difference paired by item) against the baseline,
    each with its CI. ``n`` counts prompts, windows or items. Non-finite values give no row. ``study``: the study
    the rows belong to (Study 02 measures its scale sets with these runs)."""
    from fp8lab import summary_table as st

    model = Path(runs.spec.model).name
    rows: list[dict[str, Any]] = []

    def add(**f: Any) -> None:
        v = f.get("value")
        if v is None or not math.isfinite(float(v)):
            return
        if not _finite_ci(f.get("ci")):
            f["ci"] = (None, None)
        f["ci_low"], f["ci_high"] = f.pop("ci")
        rows.append(st.make_row(study=study, model=model, **f))

    for lab, r in summary.iterrows():
        if r.status != "ok":
            continue
        res = runs.results[lab]
        device = (res.provenance or {}).get("device")
        common = {
            "kv_dtype": r.kv_cache_dtype,
            "setting": str(lab),
            "evidence": st.evidence_of(device, model),
            "device": device or "unknown",
        }
        g = greedy[greedy.label == lab]
        n_prompts = len(g)
        add(**common, metric="top3_match", value=r.get("top3_match"), ci=r.get("top3_ci"), n=n_prompts, unit="fraction")
        if lab in top3_cat.index:
            for cat in sorted(runs.prompts.category.unique()):
                add(
                    **common,
                    metric="top3_match",
                    subset=str(cat),
                    value=top3_cat.loc[lab, cat],
                    n=int((g.category == cat).sum()),
                    unit="fraction",
                )
        for metric, unit in (("first_div_median", "tokens"), ("agreement", "fraction")):
            add(**common, metric=metric, value=r.get(metric), n=n_prompts, unit=unit)
        for metric, col, unit in (("tf_top1", "tf_top1", "fraction"), ("tf_kl", "tf_kl", "nats")):
            add(**common, metric=metric, value=r.get(col), n=n_prompts, unit=unit)
        n_windows, n_items = len(runs.windows), len(runs.task)
        if n_windows:
            add(**common, metric="ppl", value=r.get("ppl"), n=n_windows, unit="1")
        if n_items:
            add(**common, metric="task_acc", value=r.get("task_acc"), ci=r.get("task_ci"), n=n_items, unit="fraction")
        if lab == BASELINE:
            continue
        if n_windows:
            add(
                **common,
                metric="ppl",
                baseline=BASELINE,
                value=r.get("delta_ppl_pct"),
                ci=r.get("delta_ppl_pct_ci"),
                n=n_windows,
                unit="%",
            )
        if n_items:
            add(
                **common,
                metric="task_acc",
                baseline=BASELINE,
                value=r.get("delta_task_acc"),
                ci=r.get("delta_task_acc_ci"),
                n=n_items,
                unit="fraction",
            )
    return rows


__all__ = [
    "BASELINE",
    "REPORT_FINE_BAND",
    "REPORT_N_TOKENS",
    "REPORT_THRESHOLD",
    "CopyItem",
    "KVConfig",
    "QualityRuns",
    "QualitySpec",
    "VerdictRules",
    "agreement_rate",
    "delta_ppl_pct",
    "capture_prompts",
    "roundtrip_points",
    "attention_error_table",
    "summary_rows",
    "by_position",
    "copy_task_items",
    "engine_roundtrip",
    "first_divergence",
    "greedy_table",
    "headline",
    "identical_prefix_len",
    "kl_topk",
    "kv_configs",
    "load_prompt_set",
    "perplexity",
    "ppl_by_label",
    "ppl_table",
    "ppl_windows",
    "roundtrip_summary",
    "roundtrip_table",
    "run_quality",
    "study_phases",
    "summary_table",
    "task_table",
    "teacher_table",
    "token_match_fraction",
    "top3_by_category",
    "topk_curve",
    "topk_overlap",
    "verdict",
    "verdict_markdown",
]
