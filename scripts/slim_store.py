"""Rewrite a committed results store (``reports/<profile>/records/*.tar.gz``) smaller, losing nothing a notebook
or the records check reads.

    python scripts/slim_store.py STORE.tar.gz [--out OUT.tar.gz] [--profile h200]

Every ``records.parquet`` is rewritten compactly (read back by :func:`fp8lab.engine.results.read_records` as before):
float columns whose values are all exactly float32 (vLLM's logprobs, engine timings) as float32, integer
lists as int16/int32 where the values fit, ``itl_s`` as ``itl_e8`` (integer ticks of 10 ns: every gap kept to
within 5 ns, where the client's clock counts nanoseconds and its event loop adds microseconds of jitter), zstd
level 19 with byte-stream-split floats.
``worker.log`` is dropped where ``worker.log.tail`` (its end, what the notebooks show) is stored beside it;
identical files (the tokenizer each Study 02 scale set copies) are stored once, as hard links. Study 03's
records (with Study 02's engines) lose the top-k lists no reader uses (:func:`slim_quality`); Study 01's
records lose ``output_token_ids`` (its tables read token counts and timings). ``samples.parquet`` is
rewritten the same compact way (read back by :func:`fp8lab.engine.results.read_records` too).

Study 04's teacher-forced quality engines (phases ``div-*``) keep ``prompt_token_logprobs`` but not the
per-position top-k lists: the candidate engine's records get what :func:`fp8lab.longctx.position_divergence`
derived from them against the ``auto`` engine (``div_top1``, ``div_topk`` overlap counts, ``div_kl`` as
float32, 7 significant digits of a lower-bound estimate), which
:func:`fp8lab.longctx.divergence_table` reads when the lists are absent. That needs the study's plan
(``--profile``: the profile the store was made with) to know the documents' token ids.

Idempotent: a slimmed store passes through unchanged in content.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: ``itl_s`` is stored as integer ticks of 10**-ITL_EXP s (``itl_e8``: 10 ns; the clock counts nanoseconds, and the
#: client's event loop adds microseconds of jitter, so a gap moves by at most 5 ns, 3 orders below what is measured).
ITL_EXP = 8


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return t


def _with_leaf(t: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_with_leaf(t.value_type, leaf))
    return leaf


def _flat(col: pa.ChunkedArray) -> np.ndarray:
    while pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        col = pc.list_flatten(col)
    return col.to_numpy(zero_copy_only=False)


def compact_table(t: pa.Table, itl_exp: int = ITL_EXP) -> pa.Table:
    """``t`` with the compact types described in the module's doc (values kept exactly, ``itl_s`` to half a tick of
    10**-itl_exp s: 5 ns by default)."""
    cols, names = [], []
    for name in t.column_names:
        col = t.column(name)
        typ, leaf = col.type, _leaf(col.type)
        if name.startswith("itl_e"):  # ticks already (a slimmed store): as they are
            cols.append(col)
            names.append(name)
            continue
        if name == "itl_s" and pa.types.is_list(typ) and pa.types.is_floating(leaf):
            arr = col.combine_chunks()
            ticks = np.round(_flat(col) * 10**itl_exp).astype(np.int64)
            cols.append(pa.ListArray.from_arrays(arr.offsets, pa.array(ticks), mask=arr.is_null()))
            names.append(f"itl_e{itl_exp}")
            continue
        if pa.types.is_float64(leaf):
            v = _flat(col)
            v = v[np.isfinite(v)] if v.dtype.kind == "f" else v
            if np.array_equal(v.astype(np.float32).astype(np.float64), v):
                col = col.cast(_with_leaf(typ, pa.float32()))
        elif pa.types.is_int64(leaf) and pa.types.is_list(typ):
            v = _flat(col)
            if not len(v) or (v.min() >= -(2**15) and v.max() < 2**15):
                col = col.cast(_with_leaf(typ, pa.int16()))
            elif v.min() >= -(2**31) and v.max() < 2**31:
                col = col.cast(_with_leaf(typ, pa.int32()))
        cols.append(col)
        names.append(name)
    return pa.table(cols, names=names, metadata=t.schema.metadata)


def write_compact(t: pa.Table, dest: Path | io.BytesIO) -> None:
    """Parquet, zstd level 19: dictionaries for strings only (they inflate noisy integers such as ``itl_ns``),
    byte-stream-split floats."""
    floats = [c for c in t.column_names if pa.types.is_floating(_leaf(t.schema.field(c).type))]
    strings = [
        c
        for c in t.column_names
        if pa.types.is_string(_leaf(t.schema.field(c).type)) or pa.types.is_large_string(_leaf(t.schema.field(c).type))
    ]
    pq.write_table(
        t,
        dest,
        compression="zstd",
        compression_level=19,
        use_dictionary=strings,
        column_encoding={c: "BYTE_STREAM_SPLIT" for c in floats},
    )


# ------------------------------------------------------------------------------------------- Study 04
def _longctx_plan(profile: str) -> Any:
    import papermill

    from fp8lab import longctx
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.profiles import load_profile, parameters_for

    nb = NOTEBOOKS_DIR / "04_long_context_ramp_128k.ipynb"
    params = {k: ast.literal_eval(v["default"]) for k, v in papermill.inspect_notebook(str(nb)).items()}
    params.update(parameters_for(nb, load_profile(profile)))
    return longctx.LongCtxPlan.from_params(params)


def divergence_columns(base: Any, cand: Any, token_ids: Any, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the candidate's row keeps of :func:`fp8lab.longctx.position_divergence` (per position, 0 first):
    ``div_top1`` and ``div_topk`` overlap counts (uint8) and ``div_kl`` (nats; position 0 has no prediction)."""
    from fp8lab import longctx

    d = longctx.position_divergence(base, cand, token_ids, top_k)
    top1 = np.concatenate([[0], d.top1.to_numpy()]).astype(np.uint8)
    topk = np.concatenate([[0], np.rint(d[f"top{top_k}"].to_numpy() * top_k)]).astype(np.uint8)
    return top1, topk, np.concatenate([[np.nan], d.kl.to_numpy()])


def _divergence_runs(study_dir: Path) -> dict[str, tuple[Path, Any]]:
    """The engines of ``study_dir`` that scored ``div-*`` documents: ``{folder name: (folder, records)}``."""
    from fp8lab.engine.results import read_records

    out = {}
    for rd in sorted(study_dir.iterdir()):
        rec = rd / "records.parquet"
        if not rec.exists():
            continue
        df = read_records(rec)
        if "phase" in df and df.phase.astype(str).str.startswith("div-").any():
            out[rd.name] = (rd, df)
    return out


def slim_divergence(study_dir: Path, profile: str, emulated_dirs: Sequence[Path] = ()) -> None:
    """Study 04's ``div-*`` records: per-position divergence into the candidates' records, top-k lists out (the
    scores of the actual tokens stay: ``prompt_token_logprobs`` of one-pass records, ``output_token_logprobs`` of
    forced ones). The candidates are the FP8 engines beside ``auto`` in ``study_dir`` and every engine of
    ``emulated_dirs`` (``04_long_context.fp8emu-*``: FP8 emulated on a CPU without the kernel, a bf16 cache, so
    their spec says ``auto``), each compared with ``study_dir``'s ``auto`` engine."""
    from fp8lab import longctx

    runs = _divergence_runs(study_dir)
    kv = {n: json.loads((rd / "spec.json").read_text())["engine"]["kv_cache_dtype"] for n, (rd, _) in runs.items()}
    bases = [n for n in runs if kv[n] == longctx.BASELINE]
    if not bases or not {"prompt_topk_ids", "output_topk_ids"} & set(runs[bases[-1]][1]):
        return  # nothing to do (no quality engines, or slimmed already)
    base_dir, base = runs[bases[-1]]
    cands = {n: r for n, r in runs.items() if kv[n] != longctx.BASELINE}
    for d in emulated_dirs:
        cands |= {f"{d.name}/{n}": r for n, r in _divergence_runs(d).items()}
    plan = _longctx_plan(profile)
    docs = longctx.quality_documents(plan)
    base = base.set_index("tag", drop=False)
    out = [(base_dir, runs[bases[-1]][1])]
    for rd, df in cands.values():
        top1, topk, kl = [None] * len(df), [None] * len(df), [None] * len(df)
        for i, tag in enumerate(df.tag):
            src, _, j = str(tag).rpartition("-")
            if not str(df.phase.iloc[i]).startswith("div-") or src not in docs or tag not in base.index:
                continue
            top1[i], topk[i], kl[i] = divergence_columns(base.loc[tag], df.iloc[i], docs[src][int(j)], plan.top_k)
        out.append(
            (rd, df.assign(div_top1=top1, div_topk=topk, div_kl=kl, div_top_k=plan.top_k, div_base=base_dir.name))
        )
    for rd, df in out:
        # one-pass (prompt_*) or through the cache (output_*, forced: fp8lab.scoring) top-k lists
        lists = ("prompt_topk_ids", "prompt_topk_logprobs", "output_topk_ids", "output_topk_logprobs")
        df = df.drop(columns=[c for c in lists if c in df])
        t = pa.Table.from_pandas(df, preserve_index=False)
        if "div_kl" in t.column_names:  # float32: 7 significant digits of a lower-bound estimate
            t = t.set_column(t.column_names.index("div_kl"), "div_kl", t.column("div_kl").cast(pa.list_(pa.float32())))
        write_compact(compact_table(t), rd / "records.parquet")


# ------------------------------------------------------------------------------------------- Studies 02 / 03
def slim_quality(t: pa.Table) -> pa.Table:
    """Study 03's records (Study 02 stores its engines with them) without what :mod:`fp8lab.quality` and
    :mod:`fp8lab.calibration` never read: the top-k lists of the perplexity windows (perplexity reads the token
    logprobs), the top-k logprobs of ``task_tf`` (its accuracy reads the top-1 ids) and the greedy outputs' top-k
    lists (only the outputs' token ids and logprobs are compared). Scored through the KV cache (forced,
    :mod:`fp8lab.scoring`) the lists are ``output_topk_*``; scored in one pass (older stores' ``teacher`` / ``ppl`` /
    ``task_tf``, newer stores' ``*_one_pass`` twins) ``prompt_topk_*``. A list a reader uses is never nulled."""
    if "phase" not in t.column_names:
        return t
    phase = t.column("phase").to_pylist()
    if not {"ppl", "task_tf", "teacher"} <= set(phase):
        return t
    null_in = {
        "prompt_topk_ids": {"ppl", "ppl_one_pass"},
        "prompt_topk_logprobs": {"ppl", "ppl_one_pass", "task_tf"},
        "output_topk_ids": {"greedy", "ppl"},
        "output_topk_logprobs": {"greedy", "ppl", "task_tf"},
    }
    for name, phases in null_in.items():
        if name not in t.column_names:
            continue
        col = t.column(name)
        keep = pa.array([p not in phases for p in phase])
        t = t.set_column(t.column_names.index(name), name, pc.if_else(keep, col, pa.nulls(len(phase), col.type)))
    return t


# ------------------------------------------------------------------------------------------- the store
def slim_tree(root: Path, profile: str | None, itl_exp: int = ITL_EXP) -> None:
    for rec in sorted(root.rglob("records.parquet")):
        t = slim_quality(pq.read_table(rec))
        if rec.parent.parent.name == "01_kv_dtype_auto_vs_fp8" and "output_token_ids" in t.column_names:
            t = t.drop_columns(["output_token_ids"])  # Study 01 reads counts and timings, never the token ids
        buf = io.BytesIO()
        write_compact(compact_table(t, itl_exp), buf)
        rec.write_bytes(buf.getvalue())
    for smp in sorted(root.rglob("samples.parquet")):
        buf = io.BytesIO()
        write_compact(compact_table(pq.read_table(smp)), buf)
        smp.write_bytes(buf.getvalue())
    for log in sorted(root.rglob("worker.log")):
        if (log.parent / "worker.log.tail").exists():
            log.unlink()
    if profile:
        for study in sorted(p for p in root.iterdir() if p.is_dir() and p.name == "04_long_context"):
            # FP8 emulated on a CPU without the kernel (fp8lab.engine.fp8emu): stored beside, compared with its auto
            slim_divergence(study, profile, sorted(root.glob("04_long_context.fp8emu-*")))


def pack(root: Path, dest: Path) -> None:
    """``root`` as a gzip tar: sorted names, fixed owner and times, identical regular files as hard links."""
    seen: dict[tuple[int, str], str] = {}
    tmp = dest.with_suffix(".tmp")
    with open(tmp, "wb") as raw:
        import gzip

        with (
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w") as tf,
        ):
            for path in [root, *sorted(root.rglob("*"))]:
                arc = "." if path == root else "./" + path.relative_to(root).as_posix()
                ti = tf.gettarinfo(str(path), arc)
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = "root"
                ti.mtime = 0
                if ti.isfile():
                    data = path.read_bytes()
                    key = (len(data), hashlib.sha256(data).hexdigest())
                    if key in seen and len(data) > 4096:
                        ti.type, ti.linkname, ti.size = tarfile.LNKTYPE, seen[key], 0
                        tf.addfile(ti)
                        continue
                    seen.setdefault(key, arc)
                    tf.addfile(ti, io.BytesIO(data))
                else:
                    tf.addfile(ti)
    os.replace(tmp, dest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--out", type=Path, help="default: rewrite STORE in place")
    ap.add_argument("--profile", help="the profile the store was made with (Study 04's documents)")
    ap.add_argument(
        "--itl-exp",
        type=int,
        default=ITL_EXP,
        choices=range(5, 10),
        help=f"store ITL gaps as ticks of 10**-N s (default {ITL_EXP}: 10 ns; 5: 10 us, for stores of "
        "millions of gaps: a gap moves by at most 5 us, about the client's event-loop jitter)",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="slim-store-") as tmp:
        root = Path(tmp) / "store"
        root.mkdir()
        with tarfile.open(a.store) as tf:
            tf.extractall(root, filter="tar")
        slim_tree(root, a.profile, a.itl_exp)
        out = a.out or a.store
        pack(root, out)
        shutil.rmtree(root)
    print(f"{a.store}: {a.store.stat().st_size if a.store.exists() else 0:,} -> {out}: {out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
