"""Study 06: where does FP8 KV make decode faster? Decode step time by context length and batch.

One engine per KV dtype serves the whole grid (CUDA graphs on unless ``enforce_eager``), prefix caching
off. Every grid point (batch ``B``, context ``L``) is measured in ``reps`` paired repetitions: the same
fresh random-token prompts for every dtype within a repetition, the dtypes alternating AB, BA, ... while
both engines are alive (:mod:`fp8lab.decode_worker` says how a step time is read from one generation).

What comes out, per point: each dtype's mean step time, the fp8/auto ratio with a 95% t interval over the
pairs (:func:`fp8lab.stats.paired_ratio`), the same-config noise floor (:func:`fp8lab.stats.self_noise`);
per dtype and batch a line ``step = a + b x context`` (:func:`fp8lab.stats.ols`); per batch the context
where fp8 becomes faster, from the fitted paired difference, with Fieller's interval; and each dtype's
fraction of the memory-bandwidth bound (:mod:`fp8lab.roofline`).

The results store keeps one folder per spec (``<runs>/06_decode/<hash>/``): ``spec.json``, one sub-folder
per worker (``g0/``, ``g1/``... a worker per GPU group) with ``rows.jsonl`` (a row per measurement, written
as it is taken), ``engines.json`` (engine facts, failures, provenance) and ``worker.log``, and
``complete.json`` once every point is measured. An incomplete run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import kvmath, stats
from fp8lab.paths import runs_dir
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    KVDtype,
    LoadFormat,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    spec_hash,
)

STUDY = "06_decode"
PROTOCOL = 1  # bump when the measurement changes, so stored runs of the old protocol are not reused

#: Published step-time fits, shown beside the measurement with their setting.
ANCHORS: tuple[dict[str, Any], ...] = (
    {
        "source": "vLLM blog, FP8 KV cache study (2026-04), as quoted in fp8lab issue 15",
        "gpu": "H100",
        "model": "Llama-3.1-8B",
        "vllm": "not stated",
        "batch": 1,
        "slope_auto_ms_per_token": 4.37e-5,
        "slope_fp8_ms_per_token": 2.37e-5,
        "break_even_tokens": 7010,
    },
)


def _ints(obj: str, name: str, values: Any, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)) or not values:
        raise SpecError(obj, name, values, f"a non-empty list of integers in [{lo}, {hi}]")
    for v in values:
        check_int(obj, name, v, lo, hi)
    if len(set(values)) != len(values):
        raise SpecError(obj, name, values, "distinct values")
    return tuple(sorted(int(v) for v in values))


@dataclass(frozen=True)
class DecodeSpec:
    """The decode grid and the engines that measure it.

    ``contexts``: prompt lengths in tokens; ``batches``: sequences decoding together; ``reps``: paired
    repetitions per point (at least 3; 5 or more for an interval worth reporting); ``decode_tokens``: the
    measured generation's length (its ``n - 1`` steps are averaged); ``kv_cache_gib``: KV budget of each
    engine in GiB (``None``: vLLM sizes it); ``max_prefill_tokens``: points with ``batch x context`` above
    it are not measured (prefill would dominate the run's time); ``concurrent_engines``: keep every dtype's
    engine alive at once and interleave them (needs memory for two engines); ``gpu_groups``: GPU index
    lists, one worker each, the grid's batches shared among them (``None``: one worker, devices as visible);
    ``engine_args``: further ``vllm.LLM`` keyword arguments, as given (e.g. ``disable_custom_all_reduce``).
    """

    model: str
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192)
    batches: tuple[int, ...] = (1, 8, 32)
    reps: int = 5
    decode_tokens: int = 64
    warmup: int = 1
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_batched_tokens: int = 16384
    max_prefill_tokens: int | None = None
    block_size: int | None = None
    enforce_eager: bool = False
    load_format: LoadFormat = "auto"
    skip_tokenizer_init: bool = False
    tensor_parallel_size: int = 1
    attention_backend: str | None = None
    concurrent_engines: bool = True
    gpu_groups: tuple[tuple[int, ...], ...] | None = None
    seed: int = 0
    timeout_s: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError("DecodeSpec", "model", self.model, "a model folder, a config.json's folder, or a hub id")
        if not isinstance(self.kv_dtypes, (list, tuple)) or not self.kv_dtypes:
            raise SpecError("DecodeSpec", "kv_dtypes", self.kv_dtypes, "a non-empty list of KV dtypes")
        for d in self.kv_dtypes:
            check_choice("DecodeSpec", "kv_dtypes", d, KVDtype)
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "contexts", _ints("DecodeSpec", "contexts", self.contexts, 16, 10_000_000))
        object.__setattr__(self, "batches", _ints("DecodeSpec", "batches", self.batches, 1, 4096))
        check_int("DecodeSpec", "reps", self.reps, 3, 1000)
        check_int("DecodeSpec", "decode_tokens", self.decode_tokens, 8, 100_000)
        check_int("DecodeSpec", "warmup", self.warmup, 0, 100)
        check_int("DecodeSpec", "max_prefill_tokens", self.max_prefill_tokens, 1, 10**9, optional=True)
        check_int("DecodeSpec", "max_num_batched_tokens", self.max_num_batched_tokens, 16, 10_000_000)
        if self.block_size is not None:
            check_choice("DecodeSpec", "block_size", self.block_size, BLOCK_SIZES)
        check_bool("DecodeSpec", "concurrent_engines", self.concurrent_engines)
        check_float("DecodeSpec", "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)
        if self.gpu_groups is not None:
            groups = self.gpu_groups
            if (
                not isinstance(groups, (list, tuple))
                or not groups
                or not all(isinstance(g, (list, tuple)) and g for g in groups)
            ):
                raise SpecError("DecodeSpec", "gpu_groups", groups, "None or a list of non-empty GPU index lists")
            for g in groups:
                if len(g) != self.tensor_parallel_size:
                    raise SpecError(
                        "DecodeSpec",
                        "gpu_groups",
                        groups,
                        f"groups of tensor_parallel_size = {self.tensor_parallel_size} GPUs each",
                    )
                for i in g:
                    check_int("DecodeSpec", "gpu_groups", i, 0, 63)
            object.__setattr__(self, "gpu_groups", tuple(tuple(int(i) for i in g) for g in groups))
        if not isinstance(self.engine_args, dict) or not all(isinstance(k, str) for k in self.engine_args):
            raise SpecError("DecodeSpec", "engine_args", self.engine_args, "a dict of vllm.LLM keyword arguments")
        for d in self.kv_dtypes:  # the engine fields are checked by EngineSpec itself, once per dtype
            self.engine_spec(d)

    def engine_spec(self, kv_dtype: str) -> EngineSpec:
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_gib=self.kv_cache_gib,
            max_num_seqs=max(self.batches),
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            load_format=self.load_format,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            enable_prefix_caching=False,
            skip_tokenizer_init=self.skip_tokenizer_init,
            attention_backend=self.attention_backend,
            timeout_s=self.timeout_s,
        )

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> DecodeSpec:
        """From a notebook's UPPER_CASE parameters (unknown names are ignored; missing ones take defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k.lower(): v for k, v in params.items() if k.lower() in names}
        if "tp" in {k.lower() for k in params}:
            kw["tensor_parallel_size"] = params.get("TP", params.get("tp"))
        if "kv_cache_gib" in kw and isinstance(kw["kv_cache_gib"], int):
            kw["kv_cache_gib"] = float(kw["kv_cache_gib"])
        return cls(**kw)

    def descriptor(self) -> dict[str, Any]:
        """What determines the outcome: the spec as given (model path unresolved, so a store loads on another
        machine), the protocol, and the vLLM and torch versions and engine-side code (another vLLM or an edited
        worker measures anew; :func:`fp8lab.results.run_versions`)."""
        from fp8lab.results import run_versions

        d = dataclasses.asdict(self)
        d.pop("timeout_s")
        return {"study": STUDY, "protocol": PROTOCOL, **run_versions(), "spec": d}


def margin(spec: DecodeSpec, batch: int, context: int) -> int:
    """Extra tokens every request but the last asks for: more than the steps the batch's prefill can take
    (``batch x context`` prompt tokens in chunks of the token budget less one decode token per sequence)."""
    per_step = max(spec.max_num_batched_tokens - batch, 1)
    return math.ceil(batch * context / per_step) + 4


def plan(spec: DecodeSpec) -> Any:
    """The grid as a table: ``batch, context_len, measure`` (bool) and ``reason`` for each point left out.

    A point is left out when a sequence does not fit ``max_model_len`` (as given, else the config's
    ``max_position_embeddings``), when the batch's KV does not fit the KV budget of the dtype with the least
    capacity (by the formula; only when ``kv_cache_gib`` is set), or when ``batch x context`` exceeds
    ``max_prefill_tokens``."""
    import pandas as pd

    lay = kvmath.load_layout(spec.engine_spec(spec.kv_dtypes[0]).model)
    limit = spec.max_model_len or lay.config.get("max_position_embeddings")
    block = spec.block_size or 16
    cap = None
    if spec.kv_cache_gib is not None:
        cap = min(
            kvmath.capacity_tokens(lay, int(spec.kv_cache_gib * 2**30), block, d, spec.tensor_parallel_size)
            for d in spec.kv_dtypes
        )
    rows = []
    for b in spec.batches:
        for c in spec.contexts:
            m = margin(spec, b, c)
            need_len = c + spec.decode_tokens + m
            reason = None
            if limit and need_len > limit:
                reason = f"{need_len} tokens per sequence > max_model_len {limit}"
            elif cap is not None and b * (need_len + block) > cap:
                reason = f"batch KV {b} x {need_len} tokens > {cap} tokens of KV budget"
            elif spec.max_prefill_tokens and b * c > spec.max_prefill_tokens:
                reason = f"prefill {b * c} tokens > max_prefill_tokens {spec.max_prefill_tokens}"
            rows.append({"batch": b, "context_len": c, "margin": m, "measure": reason is None, "reason": reason})
    return pd.DataFrame(rows)


def _shards(spec: DecodeSpec, points: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Points per worker: whole batches to one GPU group each (a batch's fit then stays on one device),
    the costliest batch first to the least loaded group."""
    groups = spec.gpu_groups or ((),)
    load = [0.0] * len(groups)
    out: list[list[tuple[int, int]]] = [[] for _ in groups]
    by_batch: dict[int, list[tuple[int, int]]] = {}
    for b, c in points:
        by_batch.setdefault(b, []).append((b, c))
    cost = {b: sum(b * c * (1 + c / 32768) for _, c in pts) for b, pts in by_batch.items()}
    for b in sorted(by_batch, key=lambda k: -cost[k]):
        i = load.index(min(load))
        out[i].extend(by_batch[b])
        load[i] += cost[b]
    return out


def _read_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(run_dir.glob("g*/rows.jsonl")):
        group = f.parent.name
        for line in f.read_text().splitlines():
            try:
                rows.append({**json.loads(line), "group": group})
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return rows


def run_decode(spec: DecodeSpec, root: Path | None = None, force: bool = False) -> DecodeRun:
    """Measure (or load, or resume) the grid of ``spec`` in the results store ``root`` (default: runs/)."""
    from fp8lab import results

    desc = spec.descriptor()
    rd = (root or runs_dir()) / STUDY / spec_hash(desc)
    if results.store_only() and not (rd / "spec.json").exists():  # a re-render: the run under another vLLM/code
        kept = results.stored_elsewhere(rd, desc)
        if kept is not None:
            return load(kept)
    for d in spec.kv_dtypes:  # this machine's paths, before any worker starts (a stored spec is not checked)
        spec.engine_spec(d).check_paths()
    if force and rd.exists():
        import shutil

        shutil.rmtree(rd)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(desc, indent=2, sort_keys=True))
    if (rd / "complete.json").exists():
        return load(rd)
    grid = plan(spec)
    points = [(int(r.batch), int(r.context_len)) for r in grid.itertuples() if r.measure]
    done = [[r["batch"], r["context_len"], r["rep"], r["kv_dtype"]] for r in _read_rows(rd) if r.get("rep", -1) >= 0]
    lay = kvmath.load_layout(spec.engine_spec(spec.kv_dtypes[0]).model)
    engine_specs = [spec.engine_spec(d).to_dict() for d in spec.kv_dtypes]
    from fp8lab import decode_worker
    from fp8lab.engine import _kill_group, _reap_descendants, worker_context

    ctx = worker_context()

    procs = []
    t0 = time.perf_counter()
    for i, pts in enumerate(_shards(spec, points)):
        if not pts:
            continue
        gdir = rd / f"g{i}"
        gdir.mkdir(exist_ok=True)
        env = dict(spec.env)
        if spec.gpu_groups:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpu_groups[i]))
        p = {
            "points": pts,
            "margins": [margin(spec, b, c) for b, c in pts],
            "reps": spec.reps,
            "decode_tokens": spec.decode_tokens,
            "warmup": spec.warmup,
            "seed": spec.seed,
            "vocab": int(lay.config["vocab_size"]),
            "concurrent": spec.concurrent_engines,
            "done": done,
            "engine_args": spec.engine_args,
        }
        proc = ctx.Process(
            target=decode_worker.entry,
            name=f"fp8lab-decode-g{i}",
            args=(str(gdir / "worker.log"), env, engine_specs, p, str(gdir)),
        )
        proc.start()
        procs.append(proc)
    for proc in procs:
        proc.join(timeout=max(spec.timeout_s - (time.perf_counter() - t0), 1.0))
        if proc.is_alive():
            _reap_descendants(proc.pid)
        _kill_group(proc.pid)
        _reap_descendants(proc.pid)
        proc.join(timeout=10)
    run = load(rd)
    if run.missing_points().empty or run.all_engines_failed():
        (rd / "complete.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        run.complete = True
    return run


@dataclass
class DecodeRun:
    """A stored decode run: its spec descriptor, measurement rows and engine facts per worker."""

    run_dir: Path
    descriptor: dict[str, Any]
    rows: Any
    engines: dict[str, dict[str, Any]]
    provenance: dict[str, Any]
    complete: bool

    @property
    def spec(self) -> dict[str, Any]:
        return self.descriptor["spec"]

    def all_engines_failed(self) -> bool:
        return bool(self.engines) and all(e.get("status") != "ok" for e in self.engines.values())

    def measured(self) -> Any:
        """Measurement rows after warm-up, the last row kept where a point was measured twice (a resume)."""
        r = self.rows
        if r.empty:
            return r
        r = r[r.rep >= 0].drop_duplicates(["batch", "context_len", "rep", "kv_dtype"], keep="last")
        return r.assign(step_ms=r.step_s * 1e3)

    def missing_points(self) -> Any:
        import pandas as pd

        spec = DecodeSpec(**{**self.spec, "gpu_groups": self.spec.get("gpu_groups")})
        grid = plan(spec)
        want = grid[grid.measure]
        m = self.measured()
        ok = {d for d, e in self.engines.items() if e.get("status") == "ok"} or set(spec.kv_dtypes)
        have = (
            m[m.kv_dtype.isin(ok)].groupby(["batch", "context_len"]).size().rename("n").reset_index()
            if not m.empty
            else pd.DataFrame(columns=["batch", "context_len", "n"])
        )
        merged = want.merge(have, on=["batch", "context_len"], how="left").fillna({"n": 0})
        return merged[merged.n < spec.reps * len(ok)]


def load(run_dir: Path) -> DecodeRun:
    """Read a stored decode run (complete or not)."""
    import pandas as pd

    desc = json.loads((run_dir / "spec.json").read_text())
    engines: dict[str, dict[str, Any]] = {}
    prov: dict[str, Any] = {}
    for f in sorted(run_dir.glob("g*/engines.json")):
        e = json.loads(f.read_text())
        prov = prov or e.get("provenance", {})
        for d, facts in e.get("engines", {}).items():
            engines.setdefault(d, {**facts, "groups": []})["groups"].append(f.parent.name)
            if facts.get("status") != "ok":
                engines[d].update(status=facts.get("status"), error=facts.get("error"))
    from fp8lab.results import note_run

    note_run(run_dir, prov, "complete" if (run_dir / "complete.json").exists() else "partial")
    return DecodeRun(
        run_dir, desc, pd.DataFrame(_read_rows(run_dir)), engines, prov, (run_dir / "complete.json").exists()
    )


def find_run(records: str | Path, spec: DecodeSpec, scratch: str | Path | None = None) -> DecodeRun:
    """The stored run of ``spec`` in ``records`` (a results store, or a ``.tar.gz`` of one, or a folder of such
    archives), whatever vLLM version measured it: for reports rendered on another machine than the one
    that measured. Raises :class:`SpecError` naming the specs on record when none matches."""
    import tarfile
    import tempfile

    root = Path(records)
    if not root.exists():
        raise SpecError(
            "notebook", "RECORDS", str(records), "an existing results store, .tar.gz of one, or folder of them"
        )
    archives = [root] if root.is_file() else sorted(root.glob("*.tar.gz"))
    bases = [] if root.is_file() else [root]
    for a in archives:
        dest = Path(scratch or tempfile.mkdtemp(prefix="fp8lab-decode-")) / a.name.removesuffix(".tar.gz")
        with tarfile.open(a) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and not m.name.startswith("/") and ".." not in m.name]
            tf.extractall(dest, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        bases.append(dest)
    placement = ("env", "gpu_groups")  # where it ran, not what was measured

    def measured_as(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in placement}

    want = measured_as(spec.descriptor()["spec"])
    seen = []
    for base in bases:
        for sj in sorted(base.rglob(f"{STUDY}/*/spec.json")):
            got = json.loads(sj.read_text())
            have = measured_as(DecodeSpec(**got["spec"]).descriptor()["spec"])
            if have == want:
                return load(sj.parent)
            seen.append(sj.parent.name)
    raise SpecError(
        "notebook",
        "RECORDS",
        str(records),
        f"a store holding a {STUDY} run of this spec (runs there: {', '.join(seen) or 'none'})",
    )


def store_bandwidth(run: DecodeRun, value: float | str | None = None) -> dict[str, Any]:
    """The memory bandwidth for the roofline: ``value`` (GB/s) when given; else the figure stored with the run
    (``bandwidth.json``, measured on the machine that ran it); else measured here and stored
    (:func:`fp8lab.bandwidth.resolve_bandwidth`)."""
    from fp8lab.bandwidth import resolve_bandwidth

    path = run.run_dir / "bandwidth.json"
    if value is None and path.exists():
        return json.loads(path.read_text())
    bw = resolve_bandwidth(value)
    if value is None:
        path.write_text(json.dumps(bw, indent=2, default=str))
    return bw


# ------------------------------------------------------------------------------------------------ analysis
def point_table(run: DecodeRun, base: str = "auto", other: str = "fp8") -> Any:
    """One row per measured (batch, context_len): each dtype's mean step (ms), ``ratio`` = other/base with its
    95% t interval over the pairs, ``n``, ``self_noise_pct`` (the larger of the two dtypes' same-config
    noise), ``beyond_noise`` and ``full_batch`` (every measurement had the whole batch decoding)."""
    import pandas as pd

    m = run.measured()
    rows = []
    if m.empty or not {base, other} <= set(m.kv_dtype):
        return pd.DataFrame(rows)
    for (b, c), g in m.groupby(["batch", "context_len"]):
        w = g.pivot_table(index="rep", columns="kv_dtype", values="step_ms").dropna()
        if base not in w or other not in w or len(w) < 2:
            continue
        r = stats.paired_ratio(w[base], w[other])
        noise = max(stats.self_noise(w[base]), stats.self_noise(w[other]))
        beyond = bool(not r.contains(1.0) and abs(r.estimate - 1) * 100 > noise)
        rows.append(
            {
                "batch": b,
                "context_len": c,
                f"{base}_step_ms": float(w[base].mean()),
                f"{other}_step_ms": float(w[other].mean()),
                "ratio": r.estimate,
                "ratio_ci_low": r.lo,
                "ratio_ci_high": r.hi,
                "n": r.n,
                "ci_half_width_pct": stats.detectable_pct(r),
                "self_noise_pct": noise,
                "beyond_noise": beyond,
                "full_batch": bool(g.full_batch.all()),
            }
        )
    return pd.DataFrame(rows)


def fit_table(run: DecodeRun) -> Any:
    """Per (kv_dtype, batch): ``step_ms = a_ms + b_ms_per_token x context`` over the points' mean steps, with
    95% t intervals; ``b_ms_per_ktoken`` is the slope per 1,000 tokens."""
    import pandas as pd

    m = run.measured()
    rows = []
    if m.empty:
        return pd.DataFrame(rows)
    means = m.groupby(["kv_dtype", "batch", "context_len"]).step_ms.mean().reset_index()
    for (d, b), g in means.groupby(["kv_dtype", "batch"]):
        if g.context_len.nunique() < 3:
            continue
        f = stats.ols(g.context_len, g.step_ms)
        (alo, ahi), (blo, bhi) = f.interval("a"), f.interval("b")
        rows.append(
            {
                "kv_dtype": d,
                "batch": b,
                "a_ms": f.a,
                "a_ms_ci_low": alo,
                "a_ms_ci_high": ahi,
                "b_ms_per_token": f.b,
                "b_ms_per_token_ci_low": blo,
                "b_ms_per_token_ci_high": bhi,
                "b_ms_per_ktoken": f.b * 1e3,
                "n_points": f.n,
            }
        )
    return pd.DataFrame(rows)


def crossover_table(run: DecodeRun, base: str = "auto", other: str = "fp8") -> Any:
    """Per batch: the context where ``other`` becomes faster than ``base``, from the line fitted to the
    paired difference of mean steps (other - base, ms) against context; Fieller's 95% interval.

    ``status``: ``none`` when the fitted difference does not fall with context (no context from which other
    becomes faster, whatever its sign at the grid's ends: ``diff_at_min_ms``, ``diff_at_max_ms``),
    ``below_grid`` when it crosses before the smallest measured context (other is faster throughout),
    ``above_grid`` past the largest (an extrapolation), else ``in_grid``."""
    import pandas as pd

    pts = point_table(run, base, other)
    rows = []
    if pts.empty:
        return pd.DataFrame(rows)
    for b, g in pts.groupby("batch"):
        if len(g) < 3:
            continue
        f = stats.ols(g.context_len, g[f"{other}_step_ms"] - g[f"{base}_step_ms"])
        root = stats.fieller_root(f)
        lo_ctx, hi_ctx = float(g.context_len.min()), float(g.context_len.max())
        # a slope below rounding (parallel lines: ~1e-16 of the steps over the grid) is zero, not a far-off root
        flat = abs(f.b) * (hi_ctx - lo_ctx) <= 1e-9 * float(
            g[[f"{base}_step_ms", f"{other}_step_ms"]].abs().max().max()
        )
        if f.b >= 0 or flat:  # other's slope is the larger (or equal): it never becomes faster as the context grows
            status, x = "none", None
        else:
            x = root.x
            status = "below_grid" if x < lo_ctx else "above_grid" if x > hi_ctx else "in_grid"
        rows.append(
            {
                "batch": b,
                "context_len": x,
                "ci_low": root.lo if root.bounded and x is not None else None,
                "ci_high": root.hi if root.bounded and x is not None else None,
                "status": status,
                "diff_at_min_ms": f.predict(lo_ctx),
                "diff_at_max_ms": f.predict(hi_ctx),
                "diff_slope_ms_per_ktoken": f.b * 1e3,
                "n_points": f.n,
            }
        )
    return pd.DataFrame(rows)


def roofline_table(run: DecodeRun, bandwidth_gbs: float) -> Any:
    """Per (kv_dtype, batch, context_len): the bandwidth bound on one step (weights + the batch's KV at the
    measured window's mean context, :func:`fp8lab.roofline.itl_lower_bound`) and ``fraction`` = bound /
    measured mean step (1 would be a step at full memory bandwidth)."""
    import pandas as pd

    from fp8lab import roofline

    m = run.measured()
    if m.empty:
        return pd.DataFrame()
    spec = run.spec
    lay = kvmath.load_layout(DecodeSpec(**spec).engine_spec(spec["kv_dtypes"][0]).model)
    tp = spec["tensor_parallel_size"]
    w = roofline.weight_bytes_per_step(lay, "auto", tp)
    rows = []
    for (d, b, c), g in m.groupby(["kv_dtype", "batch", "context_len"]):
        k = kvmath.kv_bytes_per_token(lay, d, tp)
        ctx_mean = c + spec["decode_tokens"] / 2
        bound = roofline.itl_lower_bound(w, b * ctx_mean, k, bandwidth_gbs * 1e9) * 1e3
        rows.append(
            {
                "kv_dtype": d,
                "batch": b,
                "context_len": c,
                "step_ms": g.step_ms.mean(),
                "bound_ms": bound,
                "fraction": bound / g.step_ms.mean(),
            }
        )
    return pd.DataFrame(rows)


def capacity_table(run: DecodeRun) -> Any:
    """Each engine's KV blocks beside the formula's prediction for its budget and block size (per rank)."""
    import pandas as pd

    spec = run.spec
    if spec.get("kv_cache_gib") is None:
        return pd.DataFrame()
    lay = kvmath.load_layout(DecodeSpec(**spec).engine_spec(spec["kv_dtypes"][0]).model)
    rows = []
    for d, e in run.engines.items():
        if e.get("status") != "ok":
            continue
        pred = kvmath.predict_num_blocks(
            lay, int(spec["kv_cache_gib"] * 2**30), e["block_size"], d, spec["tensor_parallel_size"]
        )
        mem = e.get("mem_per_device_after_start_bytes") or []
        rows.append(
            {
                "kv_dtype": d,
                "num_blocks": e["num_blocks"],
                "predicted_blocks": pred,
                "exact": e["num_blocks"] == pred,
                "block_size": e["block_size"],
                "attention_backend": ",".join(e.get("attention_backend") or []) or None,
                "cuda_graphs": e.get("cuda_graphs"),
                "engine_start_s": e.get("engine_start_s"),
                "mem_gib_per_device": [round(x / 2**30, 2) for x in mem],
            }
        )
    return pd.DataFrame(rows)


def _records(table: Any) -> list[dict[str, Any]]:
    """A table's rows as dicts, a missing value (NaN: pandas' form of a None among numbers) as ``None``."""
    return (
        [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in table.to_dict("records")
        ]
        if table is not None and not table.empty
        else []
    )


def summary(run: DecodeRun, bandwidth_gbs: float | None = None) -> dict[str, Any]:
    """The study's key numbers (the contract the audit reads; see the module docstring)."""
    import numpy as np

    pts, fits, cross = point_table(run), fit_table(run), crossover_table(run)
    roof = roofline_table(run, bandwidth_gbs) if bandwidth_gbs else None
    cap = capacity_table(run)
    spec = run.spec
    prov = run.provenance
    ok = {d: e.get("status") == "ok" for d, e in run.engines.items()}
    graphs = [e.get("cuda_graphs") for e in run.engines.values() if e.get("status") == "ok"]
    hw = pts.ci_half_width_pct.dropna() if not pts.empty else []
    return {
        "device": prov.get("device"),
        "vllm_version": prov.get("vllm"),
        "fp8lab_commit": prov.get("commit"),
        "model": Path(spec["model"]).name,
        "load_format": spec["load_format"],
        "cuda_graphs": bool(graphs) and all(graphs),
        "tensor_parallel_size": spec["tensor_parallel_size"],
        "concurrent_engines": spec["concurrent_engines"],
        "n_reps": spec["reps"],
        "decode_tokens": spec["decode_tokens"],
        "complete": run.complete,
        "engines_ok": ok,
        "engine_errors": {d: e.get("error") for d, e in run.engines.items() if e.get("status") != "ok"},
        "points": _records(pts),
        "fits": _records(fits),
        "crossovers": _records(cross),
        "roofline": _records(
            roof[["kv_dtype", "batch", "context_len", "fraction"]] if roof is not None and not roof.empty else None
        ),
        "capacity": _records(cap),
        "capacity_exact": bool(len(cap)) and bool(cap.exact.all()),
        "min_detectable_pct": float(np.median(hw)) if len(hw) else None,
        "max_ci_half_width_pct": float(max(hw)) if len(hw) else None,
        "bandwidth_gbs": bandwidth_gbs,
    }


def summary_rows(run: DecodeRun, base: str = "auto", other: str = "fp8") -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from :func:`point_table`: per measured point
    (``batch``, ``context_len``) each dtype's mean decode step (ms, ``n`` repetitions) and ``other``'s step against
    ``base``'s as their paired ratio (unit ``ratio``, its 95% t interval, ``beyond_noise``, ``detectable`` the
    interval's half-width as a ratio: :func:`fp8lab.stats.detectable_pct` / 100). Non-finite values give no row."""
    from fp8lab import summary_table as st

    pts = point_table(run, base, other)
    prov, spec = run.provenance or {}, run.spec
    model = Path(spec["model"]).name
    graphs = [e.get("cuda_graphs") for e in run.engines.values() if e.get("status") == "ok"]
    common = {
        "study": "decode",
        "metric": "decode_step_ms",
        "setting": "decode step, " + ("CUDA graphs" if graphs and all(graphs) else "eager"),
        "evidence": st.evidence_of(prov.get("device"), model),
        "device": prov.get("device") or "unknown",
        "model": model,
    }

    def finite(v: Any) -> bool:
        return v is not None and isinstance(v, (int, float)) and math.isfinite(v)

    rows = []
    for p in _records(pts):
        at = {"batch": int(p["batch"]), "context_len": int(p["context_len"]), "n": int(p["n"])}
        for d in (base, other):
            if finite(p.get(f"{d}_step_ms")):
                rows.append(st.make_row(**common, **at, kv_dtype=d, value=p[f"{d}_step_ms"], unit="ms"))
        if not finite(p.get("ratio")):
            continue
        ci = (p["ratio_ci_low"], p["ratio_ci_high"]) if finite(p.get("ratio_ci_low")) else (None, None)
        rows.append(
            st.make_row(
                **common,
                **at,
                kv_dtype=other,
                baseline=base,
                value=p["ratio"],
                ci_low=ci[0],
                ci_high=ci[1],
                unit="ratio",
                beyond_noise=bool(p["beyond_noise"]),
                detectable=p["ci_half_width_pct"] / 100 if finite(p.get("ci_half_width_pct")) else None,
            )
        )
    return rows


def verdict(s: dict[str, Any]) -> list[str]:
    """Headline bullets computed from a :func:`summary`."""
    out = []
    setting = (
        f"{s['model']} on {s['device']} (vLLM {s['vllm_version']}, "
        f"{'CUDA graphs' if s['cuda_graphs'] else 'no CUDA graphs (eager or CPU)'}, TP={s['tensor_parallel_size']}, "
        f"{'interleaved engines' if s['concurrent_engines'] else 'engines one after the other'})"
    )
    failed = s["engine_errors"]
    if failed:
        out.append(
            "Not measured: "
            + "; ".join(f"`{d}` ({e})" for d, e in failed.items())
            + ". The grid below has no fp8/auto comparison where an engine is missing."
        )
    pts = s["points"]
    if not pts:
        out.append(f"No point was measured by both dtypes in {setting}.")
        return out
    n = s["n_reps"]
    faster = [p for p in pts if p["beyond_noise"] and p["ratio"] < 1]
    slower = [p for p in pts if p["beyond_noise"] and p["ratio"] > 1]
    out.append(
        f"{len(pts)} grid points, {n} paired repetitions each, in {setting}. The smallest fp8/auto change "
        f"these runs resolve is about {s['min_detectable_pct']:.1f}% (median 95% CI half-width; "
        f"largest {s['max_ci_half_width_pct']:.1f}%)."
    )

    def where(ps: list[dict[str, Any]]) -> str:
        return ", ".join(f"B={p['batch']} L={p['context_len']:,} ({(p['ratio'] - 1) * 100:+.1f}%)" for p in ps)

    out.append(
        f"fp8 decodes faster beyond noise at {len(faster)} of {len(pts)} points"
        + (f": {where(faster)}" if faster else "")
        + "."
    )
    out.append(
        f"fp8 decodes slower beyond noise at {len(slower)} of {len(pts)} points"
        + (f": {where(slower)}" if slower else "")
        + "."
    )
    for c in s["crossovers"]:
        if c["status"] == "in_grid" or c["status"] == "above_grid":
            ci = f" [{c['ci_low']:,.0f}, {c['ci_high']:,.0f}]" if c["ci_low"] is not None else " (interval unbounded)"
            out.append(
                f"Batch {c['batch']}: fp8 becomes faster from about {c['context_len']:,.0f} tokens{ci}"
                + (" (past the grid: an extrapolation)" if c["status"] == "above_grid" else "")
                + "."
            )
        elif c["status"] == "below_grid":
            out.append(f"Batch {c['batch']}: fp8 is faster at every measured context by the fit.")
        elif (c.get("diff_at_max_ms") or 0) < 0:
            out.append(
                f"Batch {c['batch']}: fp8 is faster at every measured context by the fit, but its advantage "
                "does not grow with context: no crossover."
            )
        elif (c.get("diff_at_min_ms") or 0) < 0:
            out.append(
                f"Batch {c['batch']}: fp8 is faster at the shortest contexts only: the fitted fp8-auto difference "
                "grows with context and turns positive within the grid, so no crossover."
            )
        else:
            out.append(f"Batch {c['batch']}: the fitted fp8-auto difference does not fall with context: no crossover.")
    if s["roofline"]:
        import pandas as pd

        r = pd.DataFrame(s["roofline"]).groupby("kv_dtype").fraction.agg(["min", "max"])
        out.append(
            "Fraction of the memory-bandwidth bound reached: "
            + "; ".join(f"{d} {row['min']:.0%}-{row['max']:.0%}" for d, row in r.iterrows())
            + "."
        )
    if s["capacity"]:
        out.append(
            "KV blocks match the formula exactly for every engine."
            if s["capacity_exact"]
            else "KV blocks differ from the formula for some engine: see the capacity table."
        )
    return out


__all__ = [
    "ANCHORS",
    "DecodeRun",
    "DecodeSpec",
    "capacity_table",
    "crossover_table",
    "find_run",
    "fit_table",
    "load",
    "plan",
    "store_bandwidth",
    "point_table",
    "roofline_table",
    "run_decode",
    "summary",
    "verdict",
]
