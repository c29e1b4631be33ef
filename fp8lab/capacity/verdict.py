"""Study 00's verdict: :func:`verdict_markdown` (the bullets notebook 00 shows, every number from
:func:`~fp8lab.capacity.summary.summarize`), :func:`records_markdown` (the engines on record) and :func:`verdicts`
(the claims the study judges, typed on the claims audit's scale: :class:`fp8lab.study.Verdict`)."""

from __future__ import annotations

from typing import Any

from fp8lab.capacity.check import NOT_RUN
from fp8lab.study import Verdict

#: The claims :func:`verdicts` judges: key -> (claim id, the claim). ``3a`` is the claims audit's
#: (:data:`fp8lab.audit.CLAIMS`); ``00.formula`` the study's own.
CLAIMS: dict[str, tuple[str, str]] = {
    "halves": ("3a", "FP8 halves the KV cache"),
    "formula": ("00.formula", "vLLM allocates the KV blocks the KV-heads page-size formula predicts"),
}
#: Bytes per element of the baselines against which "halves" is judged (a 16-bit cache).
_TWO_BYTE = ("auto", "bfloat16", "float16")


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


def _engines(s: dict[str, Any], duplicates: int = 0) -> tuple[int, int, float | None]:
    """``(compared, exact, max |rel error|)`` over the engines measured here and the engines on record, less
    ``duplicates`` (engines measured here that the records hold too: each counted once)."""
    m = [v for v in (s.get("measured") or {}).values() if v.get("status") == "ok" and v.get("rel_error") is not None]
    rec = s.get("records") or {}
    compared = len(m) + int(rec.get("compared") or 0) - duplicates
    exact = sum(1 for v in m if float(v["rel_error"]) == 0.0) + int(rec.get("exact") or 0) - duplicates
    errs = [abs(float(v["rel_error"])) for v in m] + (
        [float(rec["max_abs_rel_error"])] if rec.get("max_abs_rel_error") is not None else []
    )
    return compared, exact, (max(errs) if errs else None)


def verdicts(s: dict[str, Any], duplicates: int = 0) -> tuple[Verdict, ...]:
    """The claims of :data:`CLAIMS` on a :func:`~fp8lab.capacity.summary.summarize` dict.

    ``3a`` (FP8 halves the KV cache): each FP8 dtype's bytes per token against a 16-bit first dtype on every config
    (``n`` the configs): confirmed when every ratio is exactly 0.5 and every engine measured here holds twice the
    first dtype's blocks to one block, refuted otherwise; not testable here without an FP8 dtype after a 16-bit one.
    ``00.formula``: the engines measured here and on record (``n``): confirmed when the formula gave every block
    count exactly, refuted when it missed one, not testable here when no engine was compared. ``duplicates``: the
    engines measured here that the engines on record hold too (the store they were measured into), counted once."""
    dts = s["kv_dtypes"]
    first, fp8 = dts[0], [d for d in dts[1:] if d.startswith("fp8")]
    cfgs = s["configs_bytes_per_token"]
    out = []
    cid, text = CLAIMS["halves"]
    if first not in _TWO_BYTE or not fp8 or not cfgs:
        out.append(Verdict(cid, text, "not testable here", f'"{text}": no FP8 dtype after a 16-bit {first}.'))
    else:
        ratios = {(m, d): v[d] / v[first] for m, v in cfgs.items() for d in fp8 if v.get(first)}
        off = {k: r for k, r in ratios.items() if r != 0.5}
        eng = {d: v for d, v in (s.get("measured") or {}).items() if d in fp8 and v.get("status") == "ok"}
        base = (s.get("measured") or {}).get(first) or {}
        blocks_off = [
            d
            for d, v in eng.items()
            if base.get("status") == "ok"
            and abs(float(v["engine_blocks"]) - 2 * float(base["engine_blocks"])) > 2  # floor on both: within a block
        ]
        word = "refuted" if off or blocks_off else "confirmed"
        d0 = fp8[0]
        b = s["bytes_per_token"]
        sentence = (
            f'"{text}": {word}: `{d0}` stores {b[d0]:,} B/token vs {b[first]:,} for `{first}` on {s["model"]}, and '
            + (
                f"x0.50 on every one of {len(cfgs)} configs"
                if not off
                else "not x0.50 on " + ", ".join(f"{m} ({d}: x{r:.2f})" for (m, d), r in off.items())
            )
            + (
                "; the engines measured here hold "
                + ", ".join(f"`{d}` {v['engine_blocks']:,}" for d, v in eng.items())
                + f" blocks vs `{first}` {base['engine_blocks']:,}"
                if eng and base.get("status") == "ok"
                else ""
            )
            + " (arithmetic on config.json; the engines' memory is the same budget either way)."
        )
        out.append(Verdict(cid, text, word, sentence, n=len(cfgs), detectable="exact (arithmetic; engines: one block)"))
    cid, text = CLAIMS["formula"]
    compared, exact, worst = _engines(s, duplicates)
    if not compared:
        out.append(Verdict(cid, text, "not testable here", f'"{text}": no engine was compared (MEASURE = False).'))
    else:
        word = "confirmed" if exact == compared else "refuted"
        how = "exactly" if word == "confirmed" else f"exactly in {exact}, largest error {worst:.2%}"
        out.append(
            Verdict(
                cid,
                text,
                word,
                f'"{text}": {word}: the formula gave the block count of {compared} engines {how} (the engines '
                "measured here and on record).",
                n=compared,
                detectable="one KV block",
            )
        )
    return tuple(out)


__all__ = ["CLAIMS", "records_markdown", "verdict_markdown", "verdicts"]
