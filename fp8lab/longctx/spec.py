"""Study 04's plan: :class:`LongCtxPlan`, everything the study runs, validated before any engine starts
(field, value and what is allowed, :class:`fp8lab.specs.SpecError`), built from a notebook's parameters by
:meth:`LongCtxPlan.from_params`. No engine and no table here; :mod:`fp8lab.longctx.run` runs a plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fp8lab import kvmath
from fp8lab.longctx.documents import PASSKEY_LABELS, PASSKEY_OUTPUT_TOKENS, PromptSource, length_grid
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    LoadFormat,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_kv_dtype,
    check_model_folder,
    resolve_model,
)
from fp8lab.workloads import InsertKind

STUDY = "04_long_context"
BASELINE = "auto"
#: How a divergence document is scored: ``cache`` (the first token as the prompt, the rest forced one decode step
#: at a time, so every position reads K/V back from the cache; the default since 2026-12-03) or ``one_pass`` (the
#: whole document as one prompt, ``max_tokens=1`` with prompt logprobs: one prefill, vllm-notes section 6; how
#: the H200 run of 2026-11 was scored, which its committed store holds).
DivergenceScoring = Literal["cache", "one_pass"]


def _tuple(v: Any) -> tuple:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


@dataclass(frozen=True)
class LongCtxPlan:
    """Everything Study 04 runs; checks itself before any engine starts.

    Performance: ``model`` (with ``load_format="dummy"`` a config folder with random weights: prompts
    become random token ids) on the ramp ``lengths`` (prompt tokens; build them with
    :func:`length_grid`), ``output_tokens`` generated per request, ``requests_per_length`` one at a time
    and ``concurrency`` at once (1: no concurrent ramp). Engine knobs: ``block_size`` (``None``: vLLM's
    default, 16 on GPU, 128 on CPU), ``max_num_batched_tokens`` (chunked-prefill budget per step),
    ``max_num_seqs``, ``kv_cache_gib`` (KV budget per engine; ``None``: vLLM sizes it from
    ``gpu_memory_utilization``). ``random_token_lengths``: lengths where a random-token prompt is timed
    beside real text. ``sweep_block_sizes`` x ``sweep_dtypes`` at ``sweep_lengths``: the block-size sweep.
    ``probe_boundary``: one start-only engine per dtype one block beyond the predicted longest context.

    Quality (``quality_model``: real weights and a tokenizer; ``None`` skips it): ``quality_docs``
    real-text and ``quality_random_docs`` random-token documents of ``quality_length`` tokens scored
    teacher-forced with ``top_k`` logprobs per position, through the KV cache or in one prefill
    (``divergence_scoring``, :data:`DivergenceScoring`); passkey prompts at ``passkey_lengths`` x
    ``passkey_depths`` x ``passkey_trials``. ``quality_concurrency``: quality requests in flight at once (1: one at a
    time; more fills the batch, as a deployment would, for many passkey prompts on a GPU);
    ``quality_max_num_batched_tokens``: the quality engines' chunked-prefill budget per step (``None``: the ramp's).
    When the quality model is the ramp model (and has real weights), the quality phases run on the ramp engines (no
    extra engine start).
    """

    model: str
    lengths: tuple[int, ...]
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    output_tokens: int = 32
    requests_per_length: int = 1
    concurrency: int = 2
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = True
    load_format: LoadFormat = "auto"
    inserts: tuple[str, ...] = ("code", "json")
    insert_every: int = 6
    random_token_lengths: tuple[int, ...] = ()
    sweep_block_sizes: tuple[int, ...] = ()
    sweep_dtypes: tuple[str, ...] = ("auto", "fp8")
    sweep_lengths: tuple[int, ...] = ()
    probe_boundary: bool = True
    quality_model: str | None = None
    quality_kv_cache_gib: float | None = None
    quality_max_num_batched_tokens: int | None = None
    quality_concurrency: int = 1
    quality_length: int | None = None
    quality_docs: int = 1
    quality_random_docs: int = 1
    top_k: int = 5
    divergence_scoring: DivergenceScoring = "cache"
    position_bins: int = 16
    passkey_lengths: tuple[int, ...] = ()
    passkey_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    passkey_trials: int = 1
    passkey_keys: tuple[int, ...] = (1,)
    seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        setf = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError("LongCtxPlan", "model", self.model, "a model folder, a config folder or a hub id")
        setf("model", resolve_model(self.model))
        for name in (
            "lengths",
            "kv_dtypes",
            "inserts",
            "random_token_lengths",
            "sweep_block_sizes",
            "sweep_dtypes",
            "sweep_lengths",
            "passkey_lengths",
            "passkey_depths",
            "passkey_keys",
        ):
            setf(name, _tuple(getattr(self, name)))
        setf("lengths", tuple(sorted(set(self.lengths))))
        if not self.lengths:
            raise SpecError("LongCtxPlan", "lengths", self.lengths, "at least one prompt length")
        for v in self.lengths:
            check_int(self, "lengths", v, 1, 10_000_000)
        if not self.kv_dtypes or self.kv_dtypes[0] != BASELINE or len(set(self.kv_dtypes)) != len(self.kv_dtypes):
            raise SpecError(
                "LongCtxPlan", "kv_dtypes", self.kv_dtypes, "distinct kv dtypes, the first 'auto' (the baseline)"
            )
        for d in (*self.kv_dtypes, *self.sweep_dtypes):
            check_kv_dtype(self, "kv_dtypes", d)
        check_int(self, "output_tokens", self.output_tokens, 2, 100_000)
        check_int(self, "requests_per_length", self.requests_per_length, 1, 1000)
        check_int(self, "concurrency", self.concurrency, 1, 100_000)
        if self.block_size is not None:
            check_choice(self, "block_size", self.block_size, BLOCK_SIZES)
        for b in self.sweep_block_sizes:
            check_choice(self, "sweep_block_sizes", b, BLOCK_SIZES)
        check_int(self, "max_num_batched_tokens", self.max_num_batched_tokens, 16, 10_000_000, optional=True)
        check_int(self, "max_num_seqs", self.max_num_seqs, 1, 65536, optional=True)
        if self.max_num_seqs is not None and self.concurrency > self.max_num_seqs:
            raise SpecError(
                "LongCtxPlan", "concurrency", self.concurrency, f"at most max_num_seqs = {self.max_num_seqs}"
            )
        check_float(self, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_float(self, "quality_kv_cache_gib", self.quality_kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_float(self, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        check_bool(self, "enforce_eager", self.enforce_eager)
        check_bool(self, "probe_boundary", self.probe_boundary)
        check_choice(self, "load_format", self.load_format, LoadFormat)
        for k in self.inserts:
            check_choice(self, "inserts", k, InsertKind)
        check_int(self, "insert_every", self.insert_every, 1, 10_000)
        longest = self.lengths[-1]
        for name in ("random_token_lengths", "sweep_lengths"):
            for v in getattr(self, name):
                check_int(self, name, v, 1, longest)
        if self.quality_model is not None:
            setf(
                "quality_model",
                check_model_folder(
                    self,
                    "quality_model",
                    self.quality_model,
                    "a local model folder with real weights and a tokenizer, or None",
                ),
            )
        check_int(self, "quality_length", self.quality_length, 2, 10_000_000, optional=True)
        check_int(self, "quality_docs", self.quality_docs, 0, 1000)
        check_int(self, "quality_random_docs", self.quality_random_docs, 0, 1000)
        check_int(self, "top_k", self.top_k, 1, 20)
        check_choice(self, "divergence_scoring", self.divergence_scoring, DivergenceScoring)
        check_int(self, "position_bins", self.position_bins, 1, 10_000)
        for v in self.passkey_lengths:
            check_int(self, "passkey_lengths", v, 32, 10_000_000)
        for v in self.passkey_depths:
            check_float(self, "passkey_depths", v, 0.0, 1.0)
        check_int(self, "passkey_trials", self.passkey_trials, 1, 1000)
        check_int(self, "quality_concurrency", self.quality_concurrency, 1, 100_000)
        check_int(
            self, "quality_max_num_batched_tokens", self.quality_max_num_batched_tokens, 16, 10_000_000, optional=True
        )
        if not self.passkey_keys:
            raise SpecError("LongCtxPlan", "passkey_keys", self.passkey_keys, "a non-empty list of needle counts")
        for v in self.passkey_keys:
            check_int(self, "passkey_keys", v, 1, len(PASSKEY_LABELS))
        check_int(self, "seed", self.seed, 0, 2**31 - 1)
        check_float(self, "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)
        limit = kvmath.load_layout(self.model).max_position_embeddings
        if limit and self.max_context > limit:
            raise SpecError(
                "LongCtxPlan",
                "lengths",
                longest,
                f"longest prompt + output_tokens at most the model's max_position_embeddings = {limit}",
            )
        if self.quality_model is not None:
            qlimit = kvmath.load_layout(self.quality_model).max_position_embeddings
            if qlimit and self.quality_context > qlimit:
                raise SpecError(
                    "LongCtxPlan",
                    "quality_length / passkey_lengths",
                    self.quality_context,
                    f"at most the quality model's max_position_embeddings = {qlimit} (with the output tokens)",
                )

    # ---------------------------------------------------------------- derived
    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> LongCtxPlan:
        """The plan from a notebook's UPPER_CASE parameters (see the notebook's ``parameters`` cell)."""
        lengths = length_grid(
            p["LENGTH_GRID"],
            p["MIN_LENGTH"],
            p["MAX_CONTEXT"],
            p["OUTPUT_TOKENS"],
            step=p.get("LENGTH_STEP", 1024),
            factor=p.get("LENGTH_FACTOR", 2.0),
        )
        last = lengths[-1]
        sweep = tuple(last if v == "longest" else v for v in _tuple(p.get("SWEEP_LENGTHS")))
        return cls(
            model=p["MODEL"],
            lengths=lengths,
            kv_dtypes=tuple(p["KV_DTYPES"]),
            output_tokens=p["OUTPUT_TOKENS"],
            requests_per_length=p["REQUESTS_PER_LENGTH"],
            concurrency=p["CONCURRENCY"],
            block_size=p["BLOCK_SIZE"],
            max_num_batched_tokens=p["MAX_NUM_BATCHED_TOKENS"],
            max_num_seqs=p["MAX_NUM_SEQS"],
            kv_cache_gib=p["KV_CACHE_GIB"],
            gpu_memory_utilization=p["GPU_MEMORY_UTILIZATION"],
            enforce_eager=p["ENFORCE_EAGER"],
            load_format=p["LOAD_FORMAT"],
            inserts=tuple(p["INSERTS"]),
            insert_every=p["INSERT_EVERY"],
            random_token_lengths=tuple(last if v == "longest" else v for v in _tuple(p["RANDOM_TOKEN_LENGTHS"])),
            sweep_block_sizes=tuple(p["SWEEP_BLOCK_SIZES"]),
            sweep_dtypes=tuple(p["SWEEP_DTYPES"]),
            sweep_lengths=sweep,
            probe_boundary=p["PROBE_BOUNDARY"],
            quality_model=p["QUALITY_MODEL"],
            quality_kv_cache_gib=p["QUALITY_KV_CACHE_GIB"],
            quality_max_num_batched_tokens=p.get("QUALITY_MAX_NUM_BATCHED_TOKENS"),
            quality_concurrency=p.get("QUALITY_CONCURRENCY", 1),
            quality_length=p["QUALITY_LENGTH"],
            quality_docs=p["QUALITY_DOCS"],
            quality_random_docs=p["QUALITY_RANDOM_DOCS"],
            top_k=p["TOP_K"],
            divergence_scoring=p.get("DIVERGENCE_SCORING", "cache"),
            position_bins=p["POSITION_BINS"],
            passkey_lengths=tuple(last if v == "longest" else v for v in _tuple(p["PASSKEY_LENGTHS"])),
            passkey_depths=tuple(p["PASSKEY_DEPTHS"]),
            passkey_trials=p["PASSKEY_TRIALS"],
            passkey_keys=tuple(_tuple(p.get("PASSKEY_KEYS", [1]))),
            seed=p["SEED"],
        )

    @property
    def max_context(self) -> int:
        """Longest request of the ramp, prompt + output tokens (the ramp engines' ``max_model_len``)."""
        return self.lengths[-1] + self.output_tokens

    @property
    def prompt_source(self) -> PromptSource:
        return "random" if self.load_format == "dummy" else "text"

    @property
    def quality_merged(self) -> bool:
        """The quality phases run on the ramp engines (same model, real weights)."""
        return self.quality_model is not None and self.quality_model == self.model and self.load_format != "dummy"

    @property
    def doc_length(self) -> int:
        """Tokens of each teacher-forced document (default: the ramp's longest prompt)."""
        return self.quality_length or self.lengths[-1]

    @property
    def quality_context(self) -> int:
        """``max_model_len`` the quality phases need."""
        need = [self.doc_length + 1] + [n + PASSKEY_OUTPUT_TOKENS for n in self.passkey_lengths]
        return max(need)

    def resolved_block_size(self) -> int:
        """The ramp's block size: ``block_size``, else vLLM's default on this machine."""
        if self.block_size is not None:
            return self.block_size
        from fp8lab.serving import default_block_size

        return default_block_size()

    def engine_spec(
        self, kv_dtype: str, *, block_size: int | None = None, max_model_len: int | None = None, quality: bool = False
    ) -> EngineSpec:
        """The engine of a ramp / sweep / probe (``quality=False``) or a separate quality engine."""
        if quality:
            return EngineSpec(
                model=self.quality_model,
                kv_cache_dtype=kv_dtype,
                block_size=block_size or self.block_size,
                max_model_len=max_model_len or self.quality_context,
                kv_cache_gib=self.quality_kv_cache_gib,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.quality_max_num_batched_tokens or self.max_num_batched_tokens,
                enforce_eager=self.enforce_eager,
                seed=self.seed,
                timeout_s=self.timeout_s,
            )
        mml = max_model_len or max(self.max_context, self.quality_context if self.quality_merged else 0)
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=block_size or self.block_size,
            max_model_len=mml,
            kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            load_format=self.load_format,
            skip_tokenizer_init=self.load_format == "dummy",
            seed=self.seed,
            timeout_s=self.timeout_s,
        )

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        return dataclasses.asdict(self)
