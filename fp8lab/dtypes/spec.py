"""Study 08's spec: :class:`MatrixSpec` (validated, ``from_params``, ``descriptor``) and its rows
(:meth:`MatrixSpec.rows`: one per ``kv_cache_dtype`` the installed vLLM accepts, plus the skip-layers variants)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fp8lab.errors import SpecError
from fp8lab.kvformats import allowed_kv_dtypes, check_kv_dtype
from fp8lab.specs import EngineSpec, check_bool, check_float, check_int, check_model_folder

STUDY = "08_kv_dtype_matrix"
PROTOCOL = 1
NAME = "MatrixSpec"
#: What a started row measures after its start and probe (``measure``: any of these; none: start and capacity only).
PHASES = ("quality", "prefix", "decode")


@dataclass(frozen=True)
class MatrixSpec:
    """One matrix run.

    ``kv_dtypes``: the rows; ``None`` (the default) is every ``kv_cache_dtype`` the installed vLLM accepts, in its
    order, resolved when the spec is built. ``skip_layer_variants``: extra rows, each ``[dtype, [layer, ...]]``
    (vLLM's ``kv_cache_dtype_skip_layers``: layer indices as strings, or ``"sliding_window"``).
    ``start_anyway``: dtypes started even where vLLM's backend answer already refuses them (to show the engine's
    own refusal; every other refusal is taken from vLLM's answer without starting an engine). One engine per row
    (its own process), ``kv_cache_gib`` of KV each, prefix caching on. Per started row: ``quality_prompts`` prompts
    of ``quality_prompt_tokens`` seeded token ids (teacher-forced logprobs, ``quality_gen_tokens`` greedy tokens),
    one prefix-cache check with the pool full, decode step times at ``decode_contexts`` (``decode_tokens`` steps,
    ``decode_reps`` repetitions, median); ``measure`` names which of these three a started row runs (an empty list:
    the start, the engine's probe and its capacity only)."""

    model: str
    kv_cache_gib: float = 0.01
    max_model_len: int = 1024
    block_size: int | None = None
    kv_dtypes: tuple[str, ...] | None = None
    skip_layer_variants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    start_anyway: tuple[str, ...] = ()
    quality_prompts: int = 4
    quality_prompt_tokens: int = 128
    quality_gen_tokens: int = 16
    prefix_prompt_tokens: int = 256
    prefix_gen_tokens: int = 8
    decode_contexts: tuple[int, ...] = (128, 512)
    decode_tokens: int = 8
    decode_reps: int = 3
    measure: tuple[str, ...] = PHASES
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    seed: int = 0
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", check_model_folder(NAME, "model", self.model))
        check_float(NAME, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True)
        check_int(NAME, "max_model_len", self.max_model_len, 16, 10_000_000)
        check_int(NAME, "block_size", self.block_size, 1, 4096, optional=True)
        if self.kv_dtypes is None:
            object.__setattr__(self, "kv_dtypes", allowed_kv_dtypes()[0])
        if isinstance(self.kv_dtypes, str) or not isinstance(self.kv_dtypes, (list, tuple)) or not self.kv_dtypes:
            raise SpecError(NAME, "kv_dtypes", self.kv_dtypes, "None (every dtype vLLM accepts) or a non-empty list")
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        for d in self.kv_dtypes:
            check_kv_dtype(NAME, "kv_dtypes", d)
        if "auto" not in self.kv_dtypes:
            raise SpecError(NAME, "kv_dtypes", self.kv_dtypes, "a list holding 'auto' (every row is judged against it)")
        variants = []
        for v in self.skip_layer_variants:
            if not isinstance(v, (list, tuple)) or len(v) != 2 or isinstance(v[1], str):
                raise SpecError(NAME, "skip_layer_variants", v, "pairs [dtype, [layer, ...]]")
            check_kv_dtype(NAME, "skip_layer_variants", v[0])
            layers = tuple(str(x) for x in v[1])
            if not layers or not all(x.isdigit() or x == "sliding_window" for x in layers):
                raise SpecError(NAME, "skip_layer_variants", v, "layer indices (as strings) or 'sliding_window'")
            variants.append((v[0], layers))
        object.__setattr__(self, "skip_layer_variants", tuple(variants))
        object.__setattr__(self, "start_anyway", tuple(self.start_anyway))
        for d in self.start_anyway:
            check_kv_dtype(NAME, "start_anyway", d)
        for name in ("quality_prompts", "quality_gen_tokens", "prefix_gen_tokens", "decode_tokens", "decode_reps"):
            check_int(NAME, name, getattr(self, name), 1, 100_000)
        check_int(NAME, "quality_prompt_tokens", self.quality_prompt_tokens, 2, self.max_model_len - 1)
        check_int(NAME, "prefix_prompt_tokens", self.prefix_prompt_tokens, 2, self.max_model_len - 1)
        object.__setattr__(self, "decode_contexts", tuple(self.decode_contexts))
        if not self.decode_contexts:
            raise SpecError(NAME, "decode_contexts", self.decode_contexts, "one context length or more")
        for c in self.decode_contexts:
            check_int(NAME, "decode_contexts", c, 1, self.max_model_len - self.decode_tokens - 1)
        object.__setattr__(self, "measure", tuple(self.measure))
        for m in self.measure:
            if m not in PHASES:
                raise SpecError(NAME, "measure", m, "any of " + " | ".join(PHASES) + " (none: start and capacity only)")
        check_bool(NAME, "enforce_eager", self.enforce_eager)
        check_float(NAME, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        check_int(NAME, "tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        check_int(NAME, "seed", self.seed, 0, 2**31 - 1)
        check_float(NAME, "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)

    def engine_spec(self, kv_dtype: str) -> EngineSpec:
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            enable_prefix_caching=True,
            timeout_s=self.timeout_s,
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per dtype, then one per skip-layers variant: ``label``, ``kv_cache_dtype``, ``skip_layers``."""
        out = [{"label": d, "kv_cache_dtype": d, "skip_layers": []} for d in self.kv_dtypes]  # type: ignore[union-attr]
        for d, layers in self.skip_layer_variants:
            out.append({"label": f"{d}+skip{'-'.join(layers)}", "kv_cache_dtype": d, "skip_layers": list(layers)})
        return out

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MatrixSpec:
        """From a notebook's UPPER_CASE parameters (unknown names ignored; ``KV_DTYPES: null`` = every dtype vLLM
        accepts; ``TP`` = ``tensor_parallel_size``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k.lower(): v for k, v in params.items() if isinstance(k, str) and k.lower() in names}
        if "TP" in params:
            kw["tensor_parallel_size"] = params["TP"]
        if isinstance(kw.get("kv_cache_gib"), int) and not isinstance(kw.get("kv_cache_gib"), bool):
            kw["kv_cache_gib"] = float(kw["kv_cache_gib"])
        return cls(**kw)

    def descriptor(self) -> dict[str, Any]:
        """What determines the outcome (hashed to name the run): the spec with its model as given
        (:func:`fp8lab.engine.results.model_ref`) and the digest of the model's config and weights, never where the model
        lies; the protocol; the vLLM and torch versions, the engine-side code and this study's own worker
        (:func:`fp8lab.engine.results.run_versions`, ``study_code``)."""
        from fp8lab.engine.results import study_descriptor

        d = dataclasses.asdict(self)
        d.pop("timeout_s")
        return study_descriptor(STUDY, PROTOCOL, d, self.model, "auto", ("dtypes/worker.py",))
