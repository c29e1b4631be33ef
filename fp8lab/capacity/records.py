"""Every engine on record: the page-size formula against the block counts of stored runs (:func:`records_check`,
:func:`summarize_records`). A root may be a results store, a study or run folder in one, a ``.tar.gz`` of a store,
or a folder of such archives (``reports/h200/records``); only the small JSON files of each run are read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fp8lab import kvmath
from fp8lab.capacity.check import hybrid_manager, prediction_row
from fp8lab.capacity.spec import check_record_roots

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
    same ``data/...`` path in this repository (runs record the absolute paths of the machine they ran on), else
    the model the name means here (:func:`fp8lab.specs.resolve_model`: a run key holds the real model by its folder
    name, ``SmolLM2-135M-Instruct``), else ``None``."""
    from pathlib import Path

    from fp8lab.paths import REPO_ROOT
    from fp8lab.specs import resolve_model

    if Path(path).exists():
        return path
    named = resolve_model(path)
    if named != path and (Path(named) / "config.json").is_file():
        return named
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


def run_members(tf: Any) -> list[Any]:
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


def run_dirs(root: Any, scratch: Any) -> list[Any]:
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
            # tarfile's "data" filter exists from Python 3.11.4; run_members already keeps plain relative files
            tf.extractall(
                dest, members=run_members(tf), **({"filter": "data"} if hasattr(tarfile, "data_filter") else {})
            )
        dirs += runs_under(dest)
    return dirs


def records_check(roots: Sequence[str]) -> Any:
    """The page-size formula against every engine stored under ``roots`` (see :func:`run_dirs` for what a root
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

    from fp8lab.engine.results import note_run

    check_record_roots(roots)
    rows, seen = [], set()
    with tempfile.TemporaryDirectory(prefix="fp8lab-records-") as scratch:
        for i, r in enumerate(roots):
            for rd in sorted(run_dirs(r, Path(scratch) / str(i)), key=lambda d: (d.parent.name, d.name)):
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
                    row = prediction_row(spec, res, eng.get("kv_cache_gib") or 0.0, eng.get("block_size"))
                    row["kv_dtype"] = eng["kv_cache_dtype"]
                    if row["predicted_blocks"] is not None:
                        row["bytes_per_block"] = kvmath.bytes_per_block(
                            model, int(row["block_size"]), kv, spec.tensor_parallel_size, hybrid_manager(e)
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


__all__ = ["RECORD_COLUMNS", "check_record_roots", "records_check", "run_dirs", "run_members", "summarize_records"]
