"""The typed, tidy summary table: one row per study x metric x kv dtype x setting, validated on write.

A study's flat summary (``<stem>.summary.json``) keeps its many key conventions for the index and old readers; its
rows (``<stem>.rows.json``, and ``<stem>.rows.parquet`` beside it) carry the same numbers under one declared schema,
so a reader (the claims audit, the index's key numbers) selects them by field (:func:`select`, :func:`one`) instead of building key strings.
Each study module makes its rows from its own tables (``serving.summary_rows``, ``quality.summary_rows``); a notebook
hands them to ``report.record_summary(values, rows=...)``, which validates them (:func:`validate`) before writing.

The schema (:data:`COLUMNS`: each field's type, whether it may be ``None`` and its allowed values, all here):

- ``study`` (:data:`STUDIES`), ``metric`` (:data:`METRICS`), ``kv_dtype`` (the configuration measured) and
  ``baseline`` (``None``: ``value`` is the configuration's own figure; a kv dtype: ``value`` is the change of
  ``kv_dtype`` against that baseline, paired where the study pairs, in ``unit``, e.g. ``%``);
- ``setting``: the study's own name of where it was measured (``closed loop``, ``open loop poisson 4/s``, a quality
  config's label ``fp8+large``, a scale set's name), with the numeric coordinates a reader selects on in their own
  fields (``concurrency``, ``batch``, ``context_len``) and ``subset`` (a part of the inputs, e.g. a prompt category,
  or of the cache, a scale granularity; ``None``: all of it);
- ``value`` (a finite number), ``ci_low`` / ``ci_high`` (its 95% interval, both or neither), ``n`` (what the interval
  is over: paired trials, prompts, windows), ``unit`` (:data:`UNITS`), ``beyond_noise`` (the interval excludes zero and
  the change exceeds the study's noise floor; ``None`` where no floor applies), ``detectable`` (the smallest change this
  run could have called beyond noise, in ``unit``; ``None`` where not computed);
- ``evidence`` (:data:`EVIDENCE`: which kind of setting the number is evidence for, :func:`evidence_of`), ``device``
  (as the runs' provenance names it) and ``model`` (folder name).

The key fields (:data:`KEY`) identify a row: two rows with the same key are an error. Standard library and pandas
only (pandas for :func:`to_frame` and Parquet, imported when used).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.errors import SpecError
from fp8lab.kvformats import FORMATS
from fp8lab.paths import TINY_MODEL_NAME

#: The studies that write rows, by the name a row's ``study`` field gives (each study's summary module writes its own).
STUDIES: tuple[str, ...] = ("kv_memory", "serving", "calibration", "quality", "long_context", "decode", "prefix_cache")
#: Units a value may have (a change against a baseline is in ``%``, ``pp`` or the figure's own unit).
UNITS: tuple[str, ...] = (
    "%",  # relative change, percent
    "pp",  # difference of two fractions, percentage points
    "tok/s",
    "ms",
    "s",
    "GiB",
    "tokens",
    "blocks",
    "requests",
    "preemptions",
    "fraction",  # a rate in [0, 1] (top-3 match, agreement)
    "ratio",  # dimensionless quotient (fp8 / auto)
    "nats",
    "1",  # a dimensionless figure that is none of the above (perplexity)
    "bytes",  # a size too small for GiB to read well (KV bytes per token; Study 00)
    "conversations",  # a count of active conversations (the prefix-cache knee; Study 07)
)
#: Which kind of setting a number is evidence for: a GPU run of a full-size model, the shipped 6.8M-parameter model
#: on a GPU (an analogue for a full-size model's speed), a CPU run (an analogue for any GPU claim), arithmetic on
#: recorded tensors with no engine (``computed``: the same on any device), or unknown.
EVIDENCE: tuple[str, ...] = ("gpu", "gpu analogue", "cpu analogue", "computed", "unknown")
#: Every metric a study may record, with what it is (units are per row: a change has the baseline's unit or %).
METRICS: Mapping[str, str] = {
    # serving (01)
    "output_tok_s": "output tokens per second of a phase (mean over trials; change: paired geometric mean)",
    "output_tok_s_no_stream": "output tokens per second measured by a client that does not read the stream",
    "ttft_p50": "time to first token, median of a trial's requests",
    "ttft_p99": "time to first token, 99th percentile of a trial's requests",
    "tpot_p50": "time per output token, median of a trial's requests",
    "tpot_p99": "time per output token, 99th percentile of a trial's requests",
    "itl_p50": "inter-token latency, median of a trial's gaps",
    "itl_p99": "inter-token latency, 99th percentile of a trial's gaps",
    "ttft_p50_pooled": "time to first token, median of every trial's requests pooled (headline concurrency)",
    "ttft_p99_pooled": "time to first token, 99th percentile of every trial's requests pooled",
    "itl_p50_pooled": "inter-token latency, median of every trial's gaps pooled (headline concurrency)",
    "itl_p99_pooled": "inter-token latency, 99th percentile of every trial's gaps pooled",
    "kv_capacity_tokens": "KV cache capacity the engine reported",
    "num_blocks": "KV blocks the engine allocated",
    "mem_peak_gib": "engine peak device memory",
    "max_concurrency_no_preemption": "largest concurrency the capacity search ran without preemption",
    "preemptions": "preemptions summed over a point's trials",
    # decode (06)
    "decode_step_ms": "mean decode step of a point (change: the paired ratio of the steps, unit ratio)",
    "decode_step_ms_colocated": "decode_step_ms in the co-located arm, beside the solo arm's (issue 35)",
    "decode_fixed_ms": "fitted fixed cost of a decode step, per engine then over engines (change: paired difference)",
    "decode_crossover_tokens": "context where the fitted fp8 and auto steps meet (interval over engine pairs)",
    # calibration (02): a scale set (setting) against the large calibration set's, per granularity (subset)
    "scale_abs_diff": "mean |scale - the large set's scale| over layers x heads x K, V",
    "scale_rel_diff": "mean |scale - the large set's scale| / the large set's scale over layers x heads x K, V",
    # quality (03; Study 02 records the same for its scale sets)
    "top3_match": "the reports' top-3 token match of greedy outputs (mean over prompts)",
    "first_div_median": "first greedy token that differs from the baseline's, median over prompts",
    "agreement": "greedy tokens equal to the baseline's (mean over prompts)",
    "tf_top1": "teacher-forced top-1 agreement with the baseline (continuation positions, scored through the KV cache)",
    "tf_kl": "teacher-forced KL divergence from the baseline (top-k, per token, scored through the KV cache)",
    "ppl": "perplexity on held-out text windows, scored through the KV cache (change: % paired by window)",
    "tf_top1_one_pass": "tf_top1 scored in one prefill with prompt logprobs (a per-backend check, no verdict)",
    "ppl_one_pass": "ppl scored in one prefill with prompt logprobs (a per-backend check, no verdict; change: %)",
    "scoring_frac_differ": "share of scored positions whose logprob differs from the baseline's (subset: the method)",
    "scoring_max_abs_dlogprob": "largest |logprob - the baseline's| over scored positions (subset: the method)",
    "task_acc": "copy-task greedy token accuracy (change: difference paired by item)",
    # KV memory (00): the formula on a config (evidence computed) beside what an engine allocated
    "kv_bytes_per_token": "KV cache bytes of one token of one sequence, every layer, one TP rank (the formula)",
    "num_blocks_formula": "KV blocks the page-size formula predicts for a KV budget and block size",
    "kv_capacity_tokens_formula": "KV capacity in tokens the formula predicts (blocks x block size)",
    "max_concurrency_formula": "sequences of context_len tokens the formula's blocks hold at once (each at full length)",
    "total_memory_gib_formula": "estimated weights + KV of batch sequences of context_len tokens, one TP rank",
    "formula_exact_share": "share of stored engines whose KV block count the formula predicted exactly (n: engines)",
    # long context (04)
    "longest_context": "longest context one sequence holds (tokens): vLLM's own estimate when asked for more",
    "longest_context_formula": "longest context one sequence holds by the formula: (num_blocks - 1) x block_size",
    "max_concurrency": "sequences of context_len tokens the engine's KV blocks hold at once (setting: which blocks)",
    "passkey_accuracy": "share of passkey prompts of context_len tokens answered with the right key (greedy)",
    "passkey_accuracy_diff": "passkey accuracy minus the baseline's on the same prompts (paired over prompts)",
    "itl_p95": "inter-token latency, 95th percentile of a phase's gaps pooled",
    "e2e_p50": "end-to-end request latency, median of a phase's requests",
    "kv_usage_peak": "peak sampled KV-cache usage, fraction of the engine's blocks",
    # prefix cache (07): concurrency is the number of active conversations, subset the workload
    "prefix_hit_rate": "prefix-cache hit rate (cached / prompt tokens) of a cell, mean over trials (change: pp)",
    "prefix_hit_rate_predicted": "prefix-cache hit rate vLLM's block pool replayed predicts for a cell",
    "ttft_mean": "time to first token, mean of a cell's requests, mean over trials (change: paired ratio)",
    "prefix_knee_predicted": "most active conversations that lose no hit against an unbounded cache (the replay)",
    "prefix_knee_measured": "most active conversations measured to hold their hits (the last held N)",
}
#: The fields that identify a row (unique within a table). ``model`` is part of it since Study 00 tabulates the same
#: metric for several published configs in one run.
KEY: tuple[str, ...] = (
    "study",
    "metric",
    "kv_dtype",
    "baseline",
    "setting",
    "subset",
    "concurrency",
    "batch",
    "context_len",
    "model",
)


@dataclass(frozen=True)
class Column:
    """One field: ``kind`` (``str`` | ``int`` | ``float`` | ``bool``; a float field takes an int), whether it may be
    ``None``, its allowed values (``None``: any of its kind; a ``str`` field is never empty) and its meaning."""

    name: str
    kind: type
    nullable: bool = False
    allowed: tuple[str, ...] | None = None
    doc: str = ""

    def describe(self) -> str:
        what = {str: "a non-empty string", int: "an integer", float: "a finite number", bool: "True or False"}
        text = "one of " + " | ".join(self.allowed) if self.allowed is not None else what[self.kind]
        return text + (" or None" if self.nullable else "")


#: Every format the KV calculator knows (:data:`fp8lab.kvformats.FORMATS`: every name vLLM 0.26 and 0.32 accept).
KV_DTYPES: tuple[str, ...] = tuple(FORMATS)
COLUMNS: tuple[Column, ...] = (
    Column("study", str, allowed=tuple(STUDIES), doc="the study that measured it"),
    Column("metric", str, allowed=tuple(METRICS), doc="what was measured"),
    Column("kv_dtype", str, allowed=KV_DTYPES, doc="the configuration measured"),
    Column("baseline", str, True, KV_DTYPES, "None: the figure itself; a dtype: kv_dtype's change against it"),
    Column("setting", str, doc="where it was measured, in the study's words"),
    Column("subset", str, True, doc="a part of the inputs (a prompt category) or a scale granularity; None: all"),
    Column("concurrency", int, True, doc="requests in flight (closed loop); Study 07: active conversations"),
    Column("batch", int, True, doc="sequences per decode step"),
    Column("context_len", int, True, doc="tokens of context"),
    Column("value", float, doc="the number, in unit"),
    Column("ci_low", float, True, doc="95% interval, low end (both ends or neither)"),
    Column("ci_high", float, True, doc="95% interval, high end"),
    Column("n", int, doc="what the interval is over (paired trials, prompts, windows), 1 or more"),
    Column("unit", str, allowed=UNITS, doc="the unit of value, ci_low, ci_high, detectable"),
    Column("beyond_noise", bool, True, doc="interval excludes 0 and |change| exceeds the noise floor"),
    Column("detectable", float, True, doc="smallest change this run could call beyond noise, in unit"),
    Column("evidence", str, allowed=EVIDENCE, doc="which kind of setting it is evidence for (evidence_of)"),
    Column("device", str, doc="the device, as the runs' provenance names it"),
    Column("model", str, doc="the model folder's name"),
)
FIELDS: tuple[str, ...] = tuple(c.name for c in COLUMNS)
_BY_NAME: Mapping[str, Column] = {c.name: c for c in COLUMNS}


def _where(i: int, row: Mapping[str, Any]) -> str:
    what = ", ".join(f"{k}={row[k]!r}" for k in ("study", "metric", "kv_dtype", "setting") if k in row)
    return f"SummaryRow[{i}]" + (f" ({what})" if what else "")


def check_value(where: str, col: Column, value: Any) -> None:
    """``value`` must fit ``col``; else :class:`SpecError` naming ``where``, the field, the value and what is allowed."""
    if value is None:
        if col.nullable:
            return
        raise SpecError(where, col.name, value, col.describe())
    if col.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif col.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif col.kind is bool:
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, str) and bool(value)
    if ok and col.allowed is not None:
        ok = value in col.allowed
    if not ok:
        raise SpecError(where, col.name, value, col.describe())


def check_row(row: Mapping[str, Any], i: int = 0) -> None:
    """One row against :data:`COLUMNS` (every field present, none unknown, each of its kind and allowed values) and
    the rules between fields: both interval ends or neither, ``ci_low <= ci_high``, ``n >= 1``, ``detectable >= 0``,
    a baseline other than the dtype measured."""
    if not isinstance(row, Mapping):
        raise SpecError(f"SummaryRow[{i}]", "row", row, "a mapping of " + ", ".join(FIELDS))
    where = _where(i, row)
    for name in row:
        if name not in _BY_NAME:
            raise SpecError(where, str(name), row[name], "not a field; allowed: " + " | ".join(FIELDS))
    for col in COLUMNS:
        if col.name not in row:
            raise SpecError(where, col.name, "<missing>", "a value (" + col.describe() + ")")
        check_value(where, col, row[col.name])
    lo, hi = row["ci_low"], row["ci_high"]
    if (lo is None) != (hi is None):
        raise SpecError(where, "ci_high" if hi is None else "ci_low", None, "a number: both interval ends or neither")
    if lo is not None and lo > hi:
        raise SpecError(where, "ci_low", lo, f"at most ci_high ({hi!r})")
    if row["n"] < 1:
        raise SpecError(where, "n", row["n"], "an integer, 1 or more")
    if row["detectable"] is not None and row["detectable"] < 0:
        raise SpecError(where, "detectable", row["detectable"], "a number, 0 or more, or None")
    if row["baseline"] is not None and row["baseline"] == row["kv_dtype"]:
        raise SpecError(where, "baseline", row["baseline"], "None or a kv dtype other than kv_dtype")


def validate(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every row checked (:func:`check_row`) and no two with the same :data:`KEY`; returns them as plain dicts in
    :data:`FIELDS` order. The first problem raises :class:`SpecError` naming the row, the field, the value and what
    is allowed."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(rows):
        check_row(r, i)
        key = tuple(r[k] for k in KEY)
        if key in seen:
            raise SpecError(
                _where(i, r),
                "key",
                dict(zip(KEY, key, strict=True)),
                f"unique fields {', '.join(KEY)} (row {seen[key]} has the same)",
            )
        seen[key] = i
        out.append({k: r[k] for k in FIELDS})
    return out


def evidence_of(device: str | None, model: str | None) -> str:
    """:data:`EVIDENCE` of a number measured on ``device`` (``NVIDIA H200``, ``CPU: ...``) with ``model``."""
    if not device:
        return "unknown"
    if str(device).upper().startswith("CPU"):
        return "cpu analogue"
    return "gpu analogue" if model == TINY_MODEL_NAME else "gpu"


def make_row(**fields: Any) -> dict[str, Any]:
    """A row from keyword fields, the nullable ones defaulting to ``None``; numbers made plain Python (numpy
    scalars to ``int`` / ``float`` / ``bool``; a whole float in an integer field to ``int``, an integer in a float
    field to ``float``), then checked (:func:`check_row`)."""
    row: dict[str, Any] = {c.name: None for c in COLUMNS if c.nullable}
    for k, v in fields.items():
        if hasattr(v, "item") and not isinstance(v, (str, bytes)):
            v = v.item()
        col = _BY_NAME.get(k)
        if col is not None and col.kind is int and isinstance(v, float) and v.is_integer():
            v = int(v)
        elif col is not None and col.kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)  # one type per field, as Parquet stores it
        row[k] = v
    check_row(row)
    return row


def rows_path(summary_path: str | Path) -> Path:
    """Where the rows of the summary at ``summary_path`` live: ``<stem>.summary.json`` -> ``<stem>.rows.json``."""
    p = Path(summary_path)
    stem = p.name.removesuffix(".summary.json") if p.name.endswith(".summary.json") else p.stem
    return p.with_name(stem + ".rows.json")


def parquet_path(rows_json: str | Path) -> Path:
    """The Parquet copy beside a rows file: ``<stem>.rows.json`` -> ``<stem>.rows.parquet``."""
    p = Path(rows_json)
    return p.with_name(p.name.removesuffix(".json") + ".parquet")


def to_frame(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The rows as a pandas DataFrame with the schema's columns in order (nullable integers as ``Int64``)."""
    import pandas as pd

    df = pd.DataFrame(list(rows), columns=list(FIELDS))
    for c in COLUMNS:
        if c.kind is int:
            df[c.name] = df[c.name].astype("Int64")
        elif c.kind is float:
            df[c.name] = df[c.name].astype("float64")
        elif c.kind is bool:
            df[c.name] = df[c.name].astype("boolean")
        else:
            df[c.name] = df[c.name].astype("object")
    return df


def write_rows(rows: Iterable[Mapping[str, Any]], path: str | Path, parquet: bool = True) -> Path:
    """Validate ``rows`` (:func:`validate`; nothing is written when one fails) and write them as JSON to ``path``
    (a list of objects in :data:`FIELDS` order, one compact row per line: a diff shows the rows that changed, and
    committed reports stay small) and, with ``parquet``, beside it as Parquet (:func:`parquet_path`).
    Each file is written under a temporary name and renamed, so a reader never sees half of one."""
    clean = validate(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in clean) + "\n]\n")
    os.replace(tmp, path)
    if parquet:
        pq = parquet_path(path)
        tmp = pq.with_name(f".{pq.name}.tmp")
        to_frame(clean).to_parquet(tmp, index=False)
        os.replace(tmp, pq)
    return path


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a rows file (JSON), validated (a file that does not fit the schema raises :class:`SpecError`)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise SpecError(str(path), "rows", type(data).__name__, "a JSON list of rows")
    return validate(data)


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a Parquet copy, as plain validated dicts (missing values back to ``None``)."""
    import pandas as pd

    df = pd.read_parquet(path)
    out = []
    for rec in df.to_dict("records"):
        row = {}
        for c in COLUMNS:
            v = rec.get(c.name)
            v = None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v
            if v is not None:
                v = c.kind(v.item() if hasattr(v, "item") else v)
            row[c.name] = v
        out.append(row)
    return validate(out)


def select(rows: Iterable[Mapping[str, Any]], **fields: Any) -> list[Mapping[str, Any]]:
    """The rows whose fields equal ``fields`` (``select(rows, metric="output_tok_s", concurrency=8)``); a name that
    is not a field raises :class:`SpecError` (a typo would otherwise select nothing)."""
    for k, v in fields.items():
        if k not in _BY_NAME:
            raise SpecError("select", k, v, "a field: " + " | ".join(FIELDS))
    return [r for r in rows if all(r.get(k) == v for k, v in fields.items())]


def one(rows: Iterable[Mapping[str, Any]], **fields: Any) -> Mapping[str, Any]:
    """The one row whose fields equal ``fields``; :class:`LookupError` naming the selection when none or several
    match."""
    hits = select(rows, **fields)
    if len(hits) != 1:
        sel = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise LookupError(f"{'no' if not hits else len(hits)} summary rows with {sel}")
    return hits[0]


__all__ = [
    "COLUMNS",
    "EVIDENCE",
    "FIELDS",
    "KEY",
    "METRICS",
    "STUDIES",
    "UNITS",
    "Column",
    "evidence_of",
    "make_row",
    "one",
    "parquet_path",
    "read_parquet",
    "read_rows",
    "rows_path",
    "select",
    "to_frame",
    "validate",
    "write_rows",
]


class StudyRowsError(ValueError):
    """A study's rows file that cannot be read or does not fit the schema (:func:`study_rows`)."""


def study_rows(out_dir: str | Path, stem: str) -> list[dict[str, Any]] | None:
    """The typed rows beside a study's summary in ``out_dir`` (``<stem>.rows.json``, :mod:`fp8lab.summary_table`,
    validated on read), or None when the folder has none (a report rendered before the rows existed, or a study
    that writes none). A file that is not JSON or does not fit the schema raises :class:`StudyRowsError`."""
    path = Path(out_dir) / f"{stem}.rows.json"
    if not path.is_file():
        return None
    try:
        return read_rows(path)
    except ValueError as exc:  # SpecError (a ValueError): a row off the schema; else not JSON
        raise StudyRowsError(f"{path.name}: {exc}") from exc
