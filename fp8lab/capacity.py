"""KV capacity: the measured check against vLLM, and the key numbers of the KV-memory study.

:func:`capacity_check` starts one engine per kv dtype (through :func:`fp8lab.results.run_cached`, so a
finished run is read back, not re-run) with a fixed KV budget, and compares the engine's block count
with :func:`fp8lab.kvmath.predict_num_blocks` computed from the engine's own budget and block size, so
the comparison isolates the page-size formula (vLLM ``get_kv_cache_config_from_groups``:
``num_blocks = kv_budget_bytes // bytes_per_block``). A failed engine becomes a row with its status and
error, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fp8lab import kvmath
from fp8lab.errors import SpecError

#: Columns of :func:`capacity_check`'s table, in order.
COLUMNS = [
    "model",
    "kv_dtype",
    "status",
    "error",
    "block_size",
    "kv_budget_bytes",
    "predicted_blocks",
    "engine_blocks",
    "predicted_tokens",
    "engine_tokens",
    "rel_error",
    "predicted_ratio_vs_auto",
    "ratio_vs_auto",
]

#: ``status`` of a row whose engine was not started (``measure=False``).
NOT_RUN = "not run"


def _hybrid_manager(engine: dict[str, Any]) -> bool:
    """Whether vLLM ran its hybrid KV-cache manager: the engine's own flag when it reports one, else vLLM's
    default for the device (on for GPU, off on CPU, vLLM ``VllmConfig``); only models mixing sliding-window and
    full layers depend on it."""
    if "hybrid_kv_cache_manager" in engine:
        return bool(engine["hybrid_kv_cache_manager"])
    return engine.get("mem_kind", "gpu") == "gpu"


def _row(spec: Any, res: Any, kv_cache_gib: float, block_size: int | None) -> dict[str, Any]:
    model, kv_dtype = spec.model, spec.kv_cache_dtype
    ok = res is not None and res.status == "ok"
    e = dict(getattr(res, "engine", None) or {})
    row: dict[str, Any] = {
        "model": kvmath.load_layout(model).name,
        "kv_dtype": kv_dtype,
        "status": res.status if res is not None else NOT_RUN,
        "error": res.error if res is not None else None,
        "block_size": e.get("block_size") or block_size or (16 if res is None else None),
        "kv_budget_bytes": e.get("kv_budget_bytes") or int(kv_cache_gib * kvmath.GIB),
        "engine_blocks": e.get("num_blocks") if ok else None,
        "engine_tokens": e.get("kv_capacity_tokens") if ok else None,
        "predicted_blocks": None,
        "predicted_tokens": None,
        "rel_error": None,
    }
    if row["block_size"] is not None:
        bs = int(row["block_size"])
        tp = spec.tensor_parallel_size
        try:
            pred = kvmath.predict_num_blocks(model, int(row["kv_budget_bytes"]), bs, kv_dtype, tp, _hybrid_manager(e))
        except SpecError as exc:  # e.g. kv_dtype "auto" on a config without torch_dtype: a row, not a crash
            row["error"] = row["error"] or f"no prediction: {exc}"
        else:
            row.update(predicted_blocks=pred, predicted_tokens=pred * bs)
    if row["engine_blocks"] and row["predicted_blocks"] is not None:
        row["rel_error"] = (row["predicted_blocks"] - row["engine_blocks"]) / row["engine_blocks"]
    return row


def capacity_check(
    model: str,
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    kv_cache_gib: float = 1.0,
    block_size: int | None = None,
    *,
    max_model_len: int | None = 2048,
    measure: bool = True,
    study: str = "00_kv_memory",
    runner: Callable[..., Any] | None = None,
    **spec_kwargs: Any,
) -> Any:
    """Start one engine per kv dtype with a ``kv_cache_gib`` GiB KV budget and compare its block count
    with the prediction. Returns a pandas DataFrame with :data:`COLUMNS`:

    - ``predicted_blocks``: :func:`fp8lab.kvmath.predict_num_blocks` on the engine's ``kv_budget_bytes``
      and ``block_size`` (``block_size=None`` lets vLLM choose: 16 on GPU, 128 on CPU);
    - ``engine_blocks`` / ``engine_tokens``: the engine's ``num_blocks`` / ``kv_capacity_tokens``
      (``num_blocks x block_size``); ``predicted_tokens = predicted_blocks x block_size``;
    - ``rel_error = (predicted - engine) / engine`` blocks (0.0 is an exact match);
    - ``ratio_vs_auto`` / ``predicted_ratio_vs_auto``: blocks relative to the ``auto`` row (2.0 means
      FP8 doubles the capacity); NaN without an ``auto`` row.

    ``measure=False`` starts no engine: rows have status ``"not run"`` and only the prediction (for
    ``block_size``, or 16 when None). ``spec_kwargs`` go to :class:`~fp8lab.specs.EngineSpec`; by default
    ``load_format="dummy"`` and ``skip_tokenizer_init=True`` (the check sends no request and weight values
    do not change the KV arithmetic, so config-only folders work). ``runner`` replaces
    :func:`fp8lab.results.run_cached` (tests pass a fake engine).
    """
    import pandas as pd

    from fp8lab.specs import EngineSpec

    # Weights' values do not change the KV arithmetic, and no request is sent: random weights and no tokenizer
    # let any config folder (data/configs/*) be checked, unless the caller says otherwise.
    spec_kwargs = {"load_format": "dummy", "skip_tokenizer_init": True, **spec_kwargs}
    # EngineSpec validates model, kv dtypes, budget and block size, naming the field, before any engine starts.
    specs = [
        EngineSpec(
            model=model,
            kv_cache_dtype=dt,
            kv_cache_gib=kv_cache_gib,
            block_size=block_size,
            max_model_len=max_model_len,
            **spec_kwargs,
        )
        for dt in kv_dtypes
    ]
    if runner is None and measure:
        from fp8lab.results import run_cached as runner
    rows = []
    for spec in specs:
        res = runner(spec, (), study=study) if measure else None  # type: ignore[misc]
        rows.append(_row(spec, res, kv_cache_gib, block_size))
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col, src in (("ratio_vs_auto", "engine_blocks"), ("predicted_ratio_vs_auto", "predicted_blocks")):
        base = df.loc[df.kv_dtype == "auto", src].dropna()
        df[col] = df[src].astype(float) / float(base.iloc[0]) if len(base) and base.iloc[0] else float("nan")
    return df


# --------------------------------------------------------------------------------------------------
# Every engine on record: the formula against the block counts of stored runs
# --------------------------------------------------------------------------------------------------

#: Columns of :func:`records_check`'s table, in order.
RECORD_COLUMNS = [
    "study",
    "run",
    "device",
    "model",
    "kv_dtype",
    "status",
    "error",
    "block_size",
    "kv_budget_gib",
    "tensor_parallel_size",
    "bytes_per_block",
    "predicted_blocks",
    "engine_blocks",
    "rel_error",
]


def _resolve_model(path: str, store: Any) -> str | None:
    """Where a run's model config is here: the stored path when it exists, else the same path inside the
    results store the run came from (model folders a study wrote there, e.g. Study 02's scale sets), else the
    same ``data/...`` path in this repository (runs record the absolute paths of the machine they ran on),
    else ``None``."""
    from pathlib import Path

    from fp8lab.paths import REPO_ROOT

    if Path(path).exists():
        return path
    parts = Path(path).parts
    for base in (
        Path(store),
        REPO_ROOT,
    ):  # the same tail of the path under each base, e.g. 02_calibration/..., data/...
        for k in range(1, len(parts)):
            if (base / parts[k]).is_dir() and (here := base.joinpath(*parts[k:])).exists():
                return str(here)
    return None


_RUN_FILES = ("/spec.json", "/engine.json", "/provenance.json", "/config.json")


def _run_members(tf: Any) -> list[Any]:
    """The members of a store archive that a check reads: regular files named like a run's JSON files, at
    relative paths without ``..`` (nothing lands outside the scratch folder)."""
    from pathlib import PurePosixPath

    return [
        m
        for m in tf.getmembers()
        if m.isfile()
        and m.name.endswith(_RUN_FILES)
        and not PurePosixPath(m.name).is_absolute()
        and ".." not in PurePosixPath(m.name).parts
    ]


def _run_dirs(root: Any, scratch: Any) -> list[Any]:
    """Run folders (holding ``spec.json`` and ``engine.json``) under ``root``: a results store, a study folder,
    one run, a ``.tar.gz`` of a store, or a folder of such archives (``reports/<profile>/records``)."""
    import tarfile
    from pathlib import Path

    def runs_under(folder: Path) -> list[Path]:
        return [
            p.parent
            for p in folder.rglob("engine.json")
            if (p.parent / "spec.json").exists()
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        ]  # not a half-written run

    root = Path(root)
    archives = [root] if root.is_file() else sorted(root.glob("*.tar.gz"))
    dirs = [] if root.is_file() else runs_under(root)
    for i, a in enumerate(archives):
        dest = Path(scratch) / f"{i}-{a.name.removesuffix('.tar.gz')}"
        with tarfile.open(a) as tf:  # only the small JSON files a check reads (stores hold links and Parquet)
            # tarfile's "data" filter exists from Python 3.11.4; _run_members already keeps plain relative files
            tf.extractall(
                dest, members=_run_members(tf), **({"filter": "data"} if hasattr(tarfile, "data_filter") else {})
            )
        dirs += runs_under(dest)
    return dirs


def check_record_roots(roots: Any) -> list[str]:
    """``ENGINE_RECORDS`` checked before any engine starts: a list of existing paths (see :func:`_run_dirs`)."""
    from pathlib import Path

    allowed = (
        "allowed: a list of existing paths, each a results store folder (runs/, $FP8LAB_RUNS), a study or run "
        "folder in one, a .tar.gz of a store, or a folder of them (reports/h200/records)"
    )
    if isinstance(roots, (str, bytes)) or not isinstance(roots, Sequence):
        raise SpecError("notebook", "ENGINE_RECORDS", roots, "not a list; " + allowed)
    for r in roots:
        if not isinstance(r, str) or not Path(r).exists():
            raise SpecError("notebook", "ENGINE_RECORDS", r, "no such path; " + allowed)
    return list(roots)


def records_check(roots: Sequence[str]) -> Any:
    """The page-size formula against every engine stored under ``roots`` (see :func:`_run_dirs` for what a root
    may be): for each run, :func:`fp8lab.kvmath.predict_num_blocks` from the run's model config, kv dtype,
    tensor-parallel size and the engine's own budget and block size, beside the engine's ``num_blocks``.

    Returns a pandas DataFrame with :data:`RECORD_COLUMNS`, one row per distinct run (by run hash), so studies
    that never set out to test the formula (serving, quality, long context, other block sizes and configs) test it
    too. A run whose engine failed keeps its status and error; a run whose model config is not found here gets
    ``error`` "model config not found" and no prediction. Raises :class:`~fp8lab.specs.SpecError` naming
    ``ENGINE_RECORDS`` when a root does not exist.
    """
    import json
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import pandas as pd

    from fp8lab.results import note_run

    check_record_roots(roots)
    rows, seen = [], set()
    with tempfile.TemporaryDirectory(prefix="fp8lab-records-") as scratch:
        for i, r in enumerate(roots):
            for rd in sorted(_run_dirs(r, Path(scratch) / str(i)), key=lambda d: (d.parent.name, d.name)):
                if rd.name in seen:
                    continue
                seen.add(rd.name)
                eng = json.loads((rd / "spec.json").read_text())["engine"]
                meta = json.loads((rd / "engine.json").read_text())
                prov = json.loads((rd / "provenance.json").read_text()) if (rd / "provenance.json").exists() else {}
                note_run(f"{rd.parent.name}/{rd.name}", prov, meta.get("status"))
                e = meta.get("engine") or {}
                model = _resolve_model(eng["model"], rd.parent.parent)
                kv = eng["kv_cache_dtype"]
                if kv == "auto" and eng.get("dtype") in ("bfloat16", "float16"):
                    kv = eng["dtype"]  # the cache follows the run's model dtype, not the checkpoint's
                res = SimpleNamespace(status=meta["status"], error=meta.get("error"), engine=e)
                spec = SimpleNamespace(model=model, kv_cache_dtype=kv, tensor_parallel_size=eng["tensor_parallel_size"])
                base = {
                    "study": rd.parent.name,
                    "run": rd.name,
                    "device": prov.get("device"),
                    "tensor_parallel_size": eng["tensor_parallel_size"],
                }
                if model is None:
                    row = {
                        "model": Path(eng["model"]).name,
                        "kv_dtype": eng["kv_cache_dtype"],
                        "status": meta["status"],
                        "error": f"model config not found here: {eng['model']}",
                        "block_size": e.get("block_size"),
                        "kv_budget_bytes": e.get("kv_budget_bytes"),
                        "engine_blocks": e.get("num_blocks"),
                    }
                else:
                    row = _row(spec, res, eng.get("kv_cache_gib") or 0.0, eng.get("block_size"))
                    row["kv_dtype"] = eng["kv_cache_dtype"]
                    if row["predicted_blocks"] is not None:
                        row["bytes_per_block"] = kvmath.bytes_per_block(
                            model, int(row["block_size"]), kv, spec.tensor_parallel_size, _hybrid_manager(e)
                        )
                budget = row.pop("kv_budget_bytes", None)
                rows.append({**base, **row, "kv_budget_gib": budget / kvmath.GIB if budget else None})
    df = pd.DataFrame(rows, columns=RECORD_COLUMNS)
    for col in ("block_size", "bytes_per_block", "predicted_blocks", "engine_blocks"):
        df[col] = df[col].astype("Int64")
    return df


def summarize_records(df: Any, roots: Sequence[str]) -> dict[str, Any]:
    """Key numbers of :func:`records_check`'s table: engines on record, how many gave figures, how many of
    those the formula predicted exactly, the largest |rel_error|, and what they covered (distinct bytes per block,
    that is model shape x kv dtype x block size; model folders)."""
    ok = df[df.engine_blocks.notna() & df.predicted_blocks.notna()]
    rel = ok.rel_error.astype(float).abs()
    return {
        "roots": [str(r) for r in roots],
        "engines": int(len(df)),
        "compared": int(len(ok)),
        "exact": int((rel == 0).sum()),
        "max_abs_rel_error": float(rel.max()) if len(ok) else None,
        "studies": sorted(df.study.unique().tolist()),
        "devices": sorted(str(d) for d in df.device.dropna().unique()),
        "page_sizes": sorted({int(b) for b in ok.bytes_per_block}),
        "models": sorted(set(ok.model)),
        "not_compared": {f"{r.study}/{r.run}": r.error or r.status for r in df.itertuples() if r.Index not in ok.index},
    }


def records_markdown(s: dict[str, Any]) -> str:
    """One Markdown bullet for :func:`summarize_records`'s numbers."""
    if not s["engines"]:
        return "- **Engines on record**: none under " + ", ".join(f"`{r}`" for r in s["roots"]) + "."
    if not s["compared"]:
        return f"- **Engines on record**: {s['engines']} runs, none with both an engine block count and a prediction."
    how = (
        "exactly"
        if s["exact"] == s["compared"]
        else f"exactly in {s['exact']}, largest error {s['max_abs_rel_error']:.2%}"
    )
    skipped = f"; {len(s['not_compared'])} not compared (failed or no config)" if s["not_compared"] else ""
    return (
        f"- **Engines on record** ({', '.join(s['devices']) or 'device not recorded'}; studies "
        f"{', '.join(s['studies'])}): the formula predicted the block count of {s['compared']} engines "
        f"{how}, over {len(s['page_sizes'])} distinct block sizes in bytes ({len(s['models'])} model folders){skipped}."
    )


# --------------------------------------------------------------------------------------------------
# The study's key numbers and verdict
# --------------------------------------------------------------------------------------------------


def _nested(df: Any, value: str) -> dict[str, dict[str, Any]]:
    """``{model: {kv_dtype: value}}`` from a tidy frame."""
    return {m: dict(zip(g.kv_dtype, g[value], strict=True)) for m, g in df.groupby("model", sort=False)}


def summarize(
    model: str,
    kv_dtypes: Sequence[str],
    formula: Any,
    plan: Any,
    memory: Any,
    check: Any,
    records: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Key numbers of the KV-memory study (notebook 00) for :func:`fp8lab.report.record_summary`.

    ``formula``: rows of :func:`kvmath.summary_row`; ``plan``: of :func:`kvmath.plan_capacity`;
    ``memory``: of :func:`kvmath.memory_rows`; ``check``: :func:`capacity_check`'s table; ``records``:
    :func:`summarize_records` of the engines on record, when checked. ``model`` is the name of the measured
    model (its row in ``formula``). Ratios are against the first kv dtype.
    """
    first = kv_dtypes[0]
    bpt = {r.model: {d: int(getattr(r, f"bytes_per_token_{d}")) for d in kv_dtypes} for r in formula.itertuples()}
    ok = check[check.status == "ok"]
    rel = ok.rel_error.dropna().abs()
    ran = bool(len(check)) and not (check.status == NOT_RUN).all()
    measured = {
        r.kv_dtype: {
            "status": r.status,
            "error": r.error,
            "block_size": r.block_size,
            "kv_budget_bytes": r.kv_budget_bytes,
            "predicted_blocks": r.predicted_blocks,
            "engine_blocks": r.engine_blocks,
            "rel_error": r.rel_error,
            "ratio_vs_auto": r.ratio_vs_auto,
        }
        for r in check.itertuples()
    }
    return {
        "model": model,
        "kv_dtypes": list(kv_dtypes),
        "bytes_per_token": bpt[model],
        "kv_ratio_vs_first": {d: bpt[model][d] / bpt[model][first] for d in kv_dtypes},
        "configs_bytes_per_token": bpt,
        "gpu_memory_gib": float(plan.gpu_memory_gib.iloc[0]) if len(plan) else None,
        "plan_context_len": int(plan.context_len.iloc[0]) if len(plan) else None,
        "max_concurrency": _nested(plan, "max_concurrency"),
        "capacity_tokens": _nested(plan, "capacity_tokens"),
        "memory_batch": int(memory.batch.iloc[0]) if len(memory) else None,
        "memory_context_len": int(memory.context_len.iloc[0]) if len(memory) else None,
        "total_memory_vs_first": _nested(memory, "total_vs_first"),
        "measured": measured,
        # None when no engine was started here (MEASURE = False): "not measured", not "failed" (the engines on
        # record are judged in ``records``)
        "measured_ok": (len(ok) == len(check)) if ran else None,
        "max_abs_rel_error": float(rel.max()) if len(rel) else None,
        "prediction_exact": (bool(len(rel)) and float(rel.max()) == 0.0) if ran else None,
        "records": records,
    }


def verdict_markdown(s: dict[str, Any]) -> str:
    """A few Markdown bullets rendering :func:`summarize`'s numbers (no number here that is not in ``s``)."""
    dts = s["kv_dtypes"]
    first, rest = dts[0], dts[1:]
    lines = []
    for d in rest:
        lines.append(
            f"- **KV per token** ({s['model']}): `{d}` stores {s['bytes_per_token'][d]:,} B/token vs "
            f"{s['bytes_per_token'][first]:,} for `{first}` (x{s['kv_ratio_vs_first'][d]:.2f}); the same factor holds "
            "for every config, since dtype bytes multiply the whole formula."
        )
        conc = {m: v for m, v in s["max_concurrency"].items() if v.get(first)}
        if conc:
            gains = [v[d] / v[first] for v in conc.values()]
            lines.append(
                f"- **Capacity** on a {s['gpu_memory_gib']:g} GiB GPU at {s['plan_context_len']:,} tokens: `{d}` gives "
                f"x{min(gains):.2f} to x{max(gains):.2f} the concurrent sequences of `{first}` across "
                f"{len(conc)} models whose weights fit (the KV budget is the same, so blocks double; concurrency "
                "follows up to rounding)."
            )
        tot = [v[d] for v in s["total_memory_vs_first"].values() if d in v]
        if tot:
            lines.append(
                f"- **Total memory** (weights + KV, batch {s['memory_batch']} x {s['memory_context_len']:,} tokens) "
                f"shrinks to x{min(tot):.2f} to x{max(tot):.2f} of `{first}`, not to x{s['kv_ratio_vs_first'][d]:.2f}: "
                "the weights do not change, so the smaller the KV share of memory, the less FP8 saves."
            )
    m = s["measured"]
    if m and all(v["status"] == NOT_RUN for v in m.values()):
        lines.append("- **Measured**: no engine was started in this run (`MEASURE = False`): predictions only.")
    elif s["measured_ok"]:
        parts = ", ".join(f"`{d}` {v['engine_blocks']:,} (predicted {v['predicted_blocks']:,})" for d, v in m.items())
        exact = "exactly" if s["prediction_exact"] else f"within {s['max_abs_rel_error']:.2%}"
        lines.append(f"- **Measured** on vLLM: KV blocks {parts}: the formula matches {exact}.")
    else:
        parts = ", ".join(
            f"`{d}`: {v['status']}" + (f" ({v['error']})" if isinstance(v.get("error"), str) and v["error"] else "")
            for d, v in m.items()
        )
        lines.append(f"- **Measured**: not every engine gave figures ({parts}).")
    if s.get("records"):
        lines.append(records_markdown(s["records"]))
    return "\n".join(lines)


__all__ = [
    "COLUMNS",
    "NOT_RUN",
    "RECORD_COLUMNS",
    "capacity_check",
    "check_record_roots",
    "records_check",
    "records_markdown",
    "summarize",
    "summarize_records",
    "verdict_markdown",
]
