"""Quality along the context in Study 04: the teacher-forced divergence of every candidate dtype from ``auto``
per position (:func:`divergence_table`, binned by :func:`divergence_by_position`, its trend by
:func:`divergence_trend`), passkey retrieval (:func:`passkey_table`, :func:`passkey_accuracy`) and the
random-token comparison (:func:`random_token_table`), from a :class:`~fp8lab.longctx.run.LongCtxResult`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.longctx.documents import passkey_correct
from fp8lab.longctx.phases import quality_documents
from fp8lab.longctx.ramp import stats
from fp8lab.longctx.run import EMULATED_ROLE, LongCtxResult
from fp8lab.longctx.spec import BASELINE
from fp8lab.specs import SpecError


def _quality_records(res: LongCtxResult, phase: str) -> dict[str, pd.DataFrame]:
    """Records of ``phase`` per kv dtype (from the ramp engines when merged, else the quality engines)."""
    role = "ramp" if res.plan.quality_merged else "quality"
    rec = res.records
    out = {}
    if rec.empty:
        return out
    for dt in [*res.plan.kv_dtypes, *res.emulated]:
        r = EMULATED_ROLE if dt in res.emulated else role
        g = rec[(rec.role == r) & (rec.kv_dtype == dt) & (rec.phase == phase)]
        if len(g):
            out[dt] = g[g.engine == g.engine.max()].set_index("tag")
    return out


def position_divergence(
    base: Mapping[str, Any], cand: Mapping[str, Any], token_ids: Sequence[int], top_k: int
) -> pd.DataFrame:
    """Per position ``>= 1`` of one teacher-forced document: ``top1`` (do the argmaxes agree),
    ``top<k>`` overlap (:func:`fp8lab.quality.topk_overlap`), ``abs_dlogprob`` of the actual token and
    ``kl`` (:func:`fp8lab.quality.kl_topk`, a lower bound, nats), and each side's ``nll`` of the actual
    token (nats). ``base`` / ``cand``: records of either scoring method (through the KV cache, forced, or one pass
    with prompt logprobs: :func:`fp8lab.scoring.sequence_logprobs`); Study 03's measure along the whole context."""
    from fp8lab.quality import kl_topk, topk_overlap
    from fp8lab.scoring import sequence_logprobs

    bl, bi, blp = sequence_logprobs(base)
    cl, ci, clp = sequence_logprobs(cand)
    bl, cl = np.asarray(bl, float), np.asarray(cl, float)
    n = min(len(bl), len(cl), len(token_ids))
    rows = {"pos": [], "top1": [], f"top{top_k}": [], "abs_dlogprob": [], "kl": [], "nll_base": [], "nll_cand": []}
    for pos in range(1, n):
        if not (np.isfinite(bl[pos]) and np.isfinite(cl[pos])):
            continue
        b_ids, c_ids = [int(t) for t in bi[pos]], [int(t) for t in ci[pos]]
        p = dict(zip(b_ids, map(float, blp[pos]), strict=True))
        q = dict(zip(c_ids, map(float, clp[pos]), strict=True))
        tok = int(token_ids[pos])
        p[tok], q[tok] = float(bl[pos]), float(cl[pos])
        rows["pos"].append(pos)
        rows["top1"].append(topk_overlap(b_ids, c_ids, 1))
        rows[f"top{top_k}"].append(topk_overlap(b_ids, c_ids, top_k))
        rows["abs_dlogprob"].append(abs(cl[pos] - bl[pos]))
        rows["kl"].append(kl_topk(p, q))
        rows["nll_base"].append(-bl[pos])
        rows["nll_cand"].append(-cl[pos])
    return pd.DataFrame(rows)


def _has_list(row: Mapping[str, Any], col: str) -> bool:
    v = row.get(col) if hasattr(row, "get") else None
    return v is not None and not isinstance(v, float)


def stored_divergence(
    base: Mapping[str, Any], cand: Mapping[str, Any], token_ids: Sequence[int], top_k: int
) -> pd.DataFrame:
    """:func:`position_divergence` from what a slimmed store keeps instead of the top-k lists
    (``scripts/slim_store.py``): the candidate's ``div_top1`` and ``div_topk`` (overlap counts of the
    argmax and of the top ``div_top_k``), ``div_kl`` (nats), computed by :func:`position_divergence`
    from the lists before they were dropped, and both sides' ``prompt_token_logprobs``. Same frame."""
    stored_k = int(cand.get("div_top_k", top_k))
    if stored_k != top_k:
        raise SpecError("LongCtxPlan", "top_k", top_k, f"{stored_k}: the top-k the stored divergence was computed with")
    from fp8lab.scoring import sequence_logprobs

    bl, cl = np.asarray(sequence_logprobs(base)[0], float), np.asarray(sequence_logprobs(cand)[0], float)
    t1, tk, kl = (np.asarray(list(cand[c])) for c in ("div_top1", "div_topk", "div_kl"))
    n = min(len(bl), len(cl), len(token_ids), len(kl))
    pos = np.arange(1, n)
    return pd.DataFrame(
        {
            "pos": pos.tolist(),
            "top1": [int(x) / 1 for x in t1[pos]],
            f"top{top_k}": [int(x) / top_k for x in tk[pos]],
            "abs_dlogprob": [abs(float(cl[i]) - float(bl[i])) for i in pos],
            "kl": [float(x) for x in kl[pos]],
            "nll_base": [-float(bl[i]) for i in pos],
            "nll_cand": [-float(cl[i]) for i in pos],
        }
    )


def divergence_table(res: LongCtxResult) -> pd.DataFrame:
    """:func:`position_divergence` of every candidate dtype against ``auto`` on every teacher-forced
    document, with ``source`` (text | random) and ``doc``; one row per position."""
    docs = quality_documents(res.plan) if res.plan.quality_model is not None else {}
    frames = []
    for source, ids_list in docs.items():
        by = _quality_records(res, f"div-{source}")
        if BASELINE not in by:
            continue
        for dt in res.quality_candidates:
            if dt not in by:
                continue
            for j, ids in enumerate(ids_list):
                tag = f"{source}-{j}"
                if tag not in by[BASELINE].index or tag not in by[dt].index:
                    continue
                b, c = by[BASELINE].loc[tag], by[dt].loc[tag]
                lists = ("prompt_topk_ids", "output_topk_ids")
                if _has_list(c, "div_kl") and not any(_has_list(b, k) and _has_list(c, k) for k in lists):
                    df = stored_divergence(b, c, ids, res.plan.top_k)
                else:
                    df = position_divergence(b, c, ids, res.plan.top_k)
                frames.append(df.assign(kv_dtype=dt, source=source, doc=j))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def divergence_by_position(div: pd.DataFrame, bins: int, length: int) -> pd.DataFrame:
    """Means per (kv_dtype, source, position bin): ``bins`` equal bins over ``[0, length)``
    (``pos_bin`` = bin start, tokens); ``flip_rate`` = 1 - top-1 agreement."""
    if div.empty:
        return div
    width = max(1, -(-length // bins))
    d = div.assign(pos_bin=(div.pos // width) * width)
    g = d.groupby(["kv_dtype", "source", "pos_bin"], sort=True)
    cols = [c for c in d.columns if c.startswith("top")] + ["abs_dlogprob", "kl", "nll_base", "nll_cand"]
    out = g[cols].mean().assign(n=g.size()).reset_index()
    out["flip_rate"] = 1.0 - out["top1"]
    return out


def divergence_trend(bypos: pd.DataFrame) -> pd.DataFrame:
    """Does the divergence grow along the context? Per (kv_dtype, source): the mean over all positions
    (bins weighted by their positions), first and last bin's ``abs_dlogprob`` and ``flip_rate``, their
    ratio, and Spearman's rank correlation of the bin means with position."""
    rows = []
    for (dt, src), g in bypos.groupby(["kv_dtype", "source"], sort=False):
        g = g.sort_values("pos_bin")
        w = g.n / g.n.sum()
        rho = g.pos_bin.rank().corr(g.abs_dlogprob.rank()) if len(g) > 2 else np.nan  # Spearman: Pearson of ranks
        rows.append(
            {
                "kv_dtype": dt,
                "source": src,
                "abs_dlogprob": float((g.abs_dlogprob * w).sum()),
                "flip_rate": float((g.flip_rate * w).sum()),
                "kl": float((g.kl * w).sum()),
                "abs_dlogprob_first": float(g.abs_dlogprob.iloc[0]),
                "abs_dlogprob_last": float(g.abs_dlogprob.iloc[-1]),
                "last_over_first": float(g.abs_dlogprob.iloc[-1] / g.abs_dlogprob.iloc[0])
                if g.abs_dlogprob.iloc[0] > 0
                else np.nan,
                "flip_rate_first": float(g.flip_rate.iloc[0]),
                "flip_rate_last": float(g.flip_rate.iloc[-1]),
                "spearman_rho": float(rho),
                "nll_base_first": float(g.nll_base.iloc[0]),
                "nll_base_last": float(g.nll_base.iloc[-1]),
            }
        )
    return pd.DataFrame(rows)


def passkey_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, passkey item): ``length``, ``depth``, ``key``, the ``answer`` (decoded greedy
    tokens) and ``correct`` (:func:`passkey_correct`)."""
    by = _quality_records(res, "passkey")
    if not by or not res.passkey:
        return pd.DataFrame()
    from fp8lab.workloads import load_tokenizer

    tok = load_tokenizer(res.plan.quality_model)
    rows = []
    for dt, g in by.items():
        for it in res.passkey:
            if it.tag not in g.index:
                continue
            text = tok.decode(list(g.loc[it.tag, "output_token_ids"]), skip_special_tokens=True)
            rows.append(
                {
                    "kv_dtype": dt,
                    "tag": it.tag,
                    "length": it.length,
                    "depth": it.depth,
                    "keys": it.keys,
                    "key": it.key,
                    "answer": text,
                    "correct": passkey_correct(text, it.key),
                }
            )
    return pd.DataFrame(rows)


def passkey_accuracy(pk: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per (kv_dtype, needles, length) over depths and trials (columns: depths, ``all``)."""
    if pk.empty:
        return pk
    idx = ["kv_dtype", "keys", "length"]
    t = pk.pivot_table(index=idx, columns="depth", values="correct", aggfunc="mean", sort=False)
    t["all"] = pk.groupby(idx, sort=False).correct.mean()
    t.columns = [c if isinstance(c, str) else f"depth {c:g}" for c in t.columns]
    return t


def passkey_paired(pk: pd.DataFrame, baseline: str = BASELINE, ci: float = 0.95) -> pd.DataFrame:
    """Retrieval accuracy of each candidate kv dtype against ``baseline`` on the same prompts, per (needles,
    length): one row with ``n`` (prompts both engines answered), ``acc_base``, ``acc``, the paired difference
    ``diff`` (candidate minus baseline, a fraction) with its ``ci_low``/``ci_high`` (:func:`fp8lab.stats.paired_delta`
    on the per-prompt differences, each -1, 0 or +1: a t-interval over prompts, the unit that varies; where no prompt
    is discordant the t-interval would have width zero, so the rule of three bounds each direction's discordant
    rate instead, +-3/n at 95%), the
    discordant counts ``only_base`` / ``only_cand`` (prompts one dtype got right and the other wrong) and ``mde``,
    the smallest difference this many prompts detect with 80% power at the 5% level
    (:func:`paired_mde_proportion`). Prompts are paired by tag (same key, haystack and depth for every dtype)."""
    from fp8lab.stats import t_interval

    cols = [
        "kv_dtype",
        "keys",
        "length",
        "n",
        "acc_base",
        "acc",
        "diff",
        "ci_low",
        "ci_high",
        "only_base",
        "only_cand",
        "mde",
    ]
    if pk.empty or baseline not in set(pk.kv_dtype):
        return pd.DataFrame(columns=cols)
    base = pk[pk.kv_dtype == baseline].set_index("tag").correct
    rows = []
    for dt in [d for d in pk.kv_dtype.unique() if d != baseline]:
        g = pk[pk.kv_dtype == dt]
        for (k, L), h in g.groupby(["keys", "length"], sort=True):
            h = h[h.tag.isin(base.index)]
            if h.empty:
                continue
            b = base.loc[h.tag].to_numpy(dtype=float)
            c = h.correct.to_numpy(dtype=float)
            d = t_interval(c - b, ci) if len(c) > 1 else None
            lo, hi = (d.lo, d.hi) if d is not None else (float("nan"), float("nan"))
            if d is not None and not np.any(c != b):
                lo, hi = -3.0 / len(c), 3.0 / len(c)
            rows.append(
                {
                    "kv_dtype": dt,
                    "keys": int(k),
                    "length": int(L),
                    "n": len(c),
                    "acc_base": float(b.mean()),
                    "acc": float(c.mean()),
                    "diff": float(c.mean() - b.mean()),
                    "ci_low": float(lo),
                    "ci_high": float(hi),
                    "only_base": int(((b == 1) & (c == 0)).sum()),
                    "only_cand": int(((b == 0) & (c == 1)).sum()),
                    "mde": paired_mde_proportion(b, c),
                }
            )
    return pd.DataFrame(rows, columns=cols)


def paired_mde_proportion(base: Any, cand: Any, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest paired difference in accuracy that ``len(base)`` paired prompts detect with ``power`` at two-sided
    level ``alpha`` (normal approximation, McNemar's design): ``(z_{1-alpha/2} + z_power) * sqrt(p_disc / n)``, where
    ``p_disc`` is the share of discordant prompts. With none discordant it plans for the share that accuracy alone
    allows (``2 p (1 - p)`` at the baseline's accuracy ``p``, independent answers), so a perfect agreement on an easy
    task does not read as the power to see any change; at an accuracy of 0 or 1, where that share is 0 too, the rule
    of three's bound on the discordant share, ``3 / n``. A fraction (0.05 = 5 points).

    >>> round(paired_mde_proportion([1, 0] * 200, [1, 0] * 199 + [0, 1]), 3)  # 2 of 400 discordant
    0.01
    >>> round(paired_mde_proportion([1, 1, 1], [1, 1, 1]), 2)  # none discordant, all right: 3/n bounds it
    1.62
    """
    from statistics import NormalDist

    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    n = len(b)
    if n == 0:
        return float("nan")
    disc = float(np.mean(b != c))
    if disc == 0.0:
        p = float(b.mean())
        # every prompt right (or wrong) on both sides plans for no discordance at all: bound it instead by the rule of
        # three (3/n at 95%, as passkey_paired's interval does), so 3 prompts all right do not "detect 0 points"
        disc = max(2 * p * (1 - p), 3.0 / n)
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return float(z * np.sqrt(disc / n))


def random_token_table(res: LongCtxResult, div_trend: pd.DataFrame | None = None) -> pd.DataFrame:
    """The "random tokens" claim, per kv dtype. Timing (``what = timing``): a random-token prompt over the
    mean of the real-text prompt of the same length run just before and just after it (``ttft_ratio``,
    ``itl_p50_ratio``; 1 = no difference), beside the after/before ratio of those two real-text runs
    (``noise_ttft_ratio``, ``noise_itl_p50_ratio``: the run-to-run noise). Divergence (``what = divergence``, per candidate dtype): the teacher-forced FP8
    error on random tokens over that on real text (``abs_dlogprob_ratio``, ``flip_rate_ratio``: how much
    a random-token test over- or under-states it)."""
    rec = res.records
    rows = []
    for L in res.plan.random_token_lengths if res.plan.prompt_source == "text" else ():
        for dt in res.plan.kv_dtypes:
            if rec.empty:
                continue
            ph = rec[(rec.role == "ramp") & (rec.kv_dtype == dt) & (rec.phase == f"randtok-L{L}")]
            ph = ph[ph.engine == ph.engine.max()] if len(ph) else ph
            rt, ta, tb = (ph[ph.tag == f"{k}-L{L}"] for k in ("randtok", "text-a", "text-b"))
            if rt.empty or ta.empty or tb.empty:
                continue
            r, a, b = stats(rt), stats(ta), stats(tb)
            rows.append(
                {
                    "kv_dtype": dt,
                    "what": "timing",
                    "length": L,
                    "ttft_ratio": r["ttft_p50_s"] / ((a["ttft_p50_s"] + b["ttft_p50_s"]) / 2),
                    "itl_p50_ratio": r["itl_p50_s"] / ((a["itl_p50_s"] + b["itl_p50_s"]) / 2),
                    "noise_ttft_ratio": b["ttft_p50_s"] / a["ttft_p50_s"],
                    "noise_itl_p50_ratio": b["itl_p50_s"] / a["itl_p50_s"],
                }
            )
    if div_trend is not None and len(div_trend):
        t = div_trend.set_index(["kv_dtype", "source"])
        for dt in res.quality_candidates:
            if (dt, "text") in t.index and (dt, "random") in t.index:
                x, r = t.loc[(dt, "text")], t.loc[(dt, "random")]
                rows.append(
                    {
                        "kv_dtype": dt,
                        "what": "divergence",
                        "length": res.plan.doc_length,
                        "abs_dlogprob_text": x.abs_dlogprob,
                        "abs_dlogprob_random": r.abs_dlogprob,
                        "abs_dlogprob_ratio": r.abs_dlogprob / x.abs_dlogprob if x.abs_dlogprob else np.nan,
                        "flip_rate_text": x.flip_rate,
                        "flip_rate_random": r.flip_rate,
                        "flip_rate_ratio": r.flip_rate / x.flip_rate if x.flip_rate else np.nan,
                    }
                )
    return pd.DataFrame(rows)
