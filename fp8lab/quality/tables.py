"""Study 03's tables from a run's records (pure functions of :class:`~fp8lab.quality.run.QualityRuns`): greedy,
teacher-forced, perplexity and copy-task tables, and one summary row per KV config (:func:`summary_table`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.quality.metrics import (
    agreement_rate,
    as_ids,
    delta_ppl_pct,
    first_divergence,
    identical_prefix_len,
    kl_topk,
    perplexity,
    token_match_fraction,
    topk_overlap,
)
from fp8lab.quality.run import QualityRuns
from fp8lab.quality.spec import BASELINE, REPORT_N_TOKENS, REPORT_THRESHOLD
from fp8lab.scoring import cache_check, sequence_logprobs
from fp8lab.stats import bootstrap_ci, bootstrap_mean_ci

#: Phases scored through the KV cache (the verdicts) and their one-pass twins (a secondary column, fp8lab.scoring).
ONE_PASS = {"teacher": "teacher_one_pass", "ppl": "ppl_one_pass"}


def greedy_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (label, prompt): ``top3_match`` (the reports' protocol), ``prefix_len``,
    ``first_div`` (NaN when never diverged), ``first_div_censored`` (never diverged = gen_tokens),
    ``agreement``, and ``max_abs_dlogprob`` (|delta| of the chosen tokens' logprobs over the
    identical prefix, where both engines saw the same context). All against the reference run."""
    ref_rec = runs.reference.records.set_index("tag")
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, "greedy")
        for pid, cat in zip(runs.prompts.id, runs.prompts.category, strict=True):
            ref_ids, ids = as_ids(ref_rec.output_token_ids[pid]), as_ids(rec.output_token_ids[pid])
            n = identical_prefix_len(ref_ids, ids)
            fd = first_divergence(ref_ids, ids)
            d = np.abs(
                np.asarray(list(rec.output_token_logprobs[pid])[:n], dtype=float)
                - np.asarray(list(ref_rec.output_token_logprobs[pid])[:n], dtype=float)
            )
            rows.append(
                {
                    "label": lab,
                    "prompt": pid,
                    "category": cat,
                    "top3_match": token_match_fraction(ref_ids, ids, REPORT_N_TOKENS),
                    "prefix_len": n,
                    "first_div": float("nan") if fd is None else fd,
                    "first_div_censored": len(ref_ids) if fd is None else fd,
                    "agreement": agreement_rate(ref_ids, ids),
                    "max_abs_dlogprob": float(d.max()) if d.size else 0.0,
                }
            )
    return pd.DataFrame(rows)


def top3_by_category(greedy: pd.DataFrame, threshold: float = REPORT_THRESHOLD) -> pd.DataFrame:
    """Mean top-3 match per label and category (plus ``all``), and whether it clears ``threshold``."""
    per = greedy.pivot_table(index="label", columns="category", values="top3_match", aggfunc="mean", sort=False)
    per["all"] = greedy.groupby("label", sort=False).top3_match.mean()
    per.columns.name = None
    per[f"all >= {threshold}"] = per["all"] >= threshold
    return per


def teacher_table(runs: QualityRuns, phase: str = "teacher") -> pd.DataFrame:
    """One row per (candidate label, prompt, scored position >= 1) of the teacher-forced sequences.

    ``phase``: ``teacher`` (through the KV cache: the continuation positions) or ``teacher_one_pass`` (one prefill:
    every position). ``segment``: ``prompt`` or ``continuation`` (the baseline's greedy tokens); ``top{k}``: top-k
    overlap with the baseline for k = 1..top_k; ``abs_dlogprob``: |delta logprob| of the actual token
    (nats); ``kl``: :func:`kl_topk` lower bound of KL(P_auto || P_candidate) (nats).
    """
    k_max = runs.spec.top_k
    base = runs.records(BASELINE, phase)
    if not len(base):
        return pd.DataFrame()
    plen = dict(zip(runs.prompts.id, runs.prompts.n_tokens, strict=True))
    conts = runs.reference_outputs()
    seqs = {pid: list(ids) + conts[pid] for pid, ids in zip(runs.prompts.id, runs.prompts.token_ids, strict=True)}
    rows = []
    for lab in runs.ok_labels:
        if lab == BASELINE:
            continue
        rec = runs.records(lab, phase)
        for pid, cat in zip(runs.prompts.id, runs.prompts.category, strict=True):
            bl, bi, blp = sequence_logprobs(base.loc[pid])
            cl, ci, clp = sequence_logprobs(rec.loc[pid])
            for pos in range(1, len(bl)):
                if not (math.isfinite(bl[pos]) and math.isfinite(cl[pos])):
                    continue  # a position this method does not score (a forced request's prompt)
                p = dict(zip(as_ids(bi[pos]), map(float, blp[pos]), strict=True))
                q = dict(zip(as_ids(ci[pos]), map(float, clp[pos]), strict=True))
                tok = seqs[pid][pos]  # the actual token: both engines return its logprob, in the top-k or not
                p[tok], q[tok] = float(bl[pos]), float(cl[pos])
                row = {
                    "label": lab,
                    "prompt": pid,
                    "category": cat,
                    "pos": pos,
                    "segment": "prompt" if pos < plen[pid] else "continuation",
                    "abs_dlogprob": abs(float(cl[pos]) - float(bl[pos])),
                    "kl": kl_topk(p, q),
                }
                for k in range(1, k_max + 1):
                    row[f"top{k}"] = topk_overlap(bi[pos], ci[pos], k)
                rows.append(row)
    return pd.DataFrame(rows)


def by_position(
    teacher: pd.DataFrame,
    bin_tokens: int = 16,
    metrics: Sequence[str] = ("top1", "abs_dlogprob", "kl"),
    min_prompts: int = 5,
) -> pd.DataFrame:
    """Teacher-forced metrics averaged per label and context-position bin (``pos_bin`` = bin start);
    ``n`` positions and ``prompts`` contributing per bin; bins with fewer than ``min_prompts`` prompts
    (the tail that only the longest prompts reach) are dropped."""
    t = teacher.assign(pos_bin=(teacher.pos // bin_tokens) * bin_tokens)
    g = t.groupby(["label", "pos_bin"], sort=True)
    out = g[list(metrics)].mean().assign(n=g.size(), prompts=g.prompt.nunique()).reset_index()
    return out[out.prompts >= min_prompts].reset_index(drop=True)


def topk_curve(teacher: pd.DataFrame, segment: str | None = "continuation") -> pd.DataFrame:
    """Mean top-k overlap per label for k = 1..K (long format: label, k, overlap)."""
    t = teacher if segment is None else teacher[teacher.segment == segment]
    cols = [c for c in t.columns if c.startswith("top") and c[3:].isdigit()]
    m = t.groupby("label", sort=False)[cols].mean().reset_index()
    long = m.melt(id_vars="label", var_name="k", value_name="overlap")
    long["k"] = long.k.str[3:].astype(int)
    return long


def ppl_table(runs: QualityRuns, phase: str = "ppl") -> pd.DataFrame:
    """One row per (label, window): ``n_tokens`` scored, ``nll`` (nats, summed), ``ppl``. ``phase``: ``ppl``
    (through the KV cache: the window's forced tokens, ``ppl_scored_tokens``) or ``ppl_one_pass`` (one prefill:
    all but the first)."""
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, phase)
        for tag in rec.index:
            a = np.asarray(sequence_logprobs(rec.loc[tag])[0], dtype=float)
            a = a[np.isfinite(a)]
            rows.append({"label": lab, "window": tag, "n_tokens": a.size, "nll": float(-a.sum()), "ppl": perplexity(a)})
    return pd.DataFrame(rows)


def ppl_by_label(ppl: pd.DataFrame) -> pd.DataFrame:
    """Token-weighted perplexity per label over all windows: ``n_tokens``, ``nll`` (nats), ``ppl``."""
    g = ppl.groupby("label", sort=False)[["n_tokens", "nll"]].sum()
    return g.assign(ppl=np.exp(g.nll / g.n_tokens))


def task_table(runs: QualityRuns) -> pd.DataFrame:
    """One row per (label, copy item). Greedy: ``token_acc`` (fraction of answer tokens right, position
    by position; one miss can derail the rest), ``exact`` (all right). Teacher-forced (no cascade):
    ``tf_acc`` (fraction of answer positions whose top-1 is the right token given the right prefix),
    ``answer_logprob`` (mean logprob of the answer tokens, nats: a continuous score). ``depth``: tokens
    between the answer's source and the end of the prompt."""
    rows = []
    for lab in runs.ok_labels:
        rec = runs.records(lab, "task")
        tf = runs.records(lab, "task_tf")
        for it in runs.task:
            out = as_ids(rec.output_token_ids[it.tag])
            acc = agreement_rate(it.answer, out)
            row = {"label": lab, "item": it.tag, "depth": it.depth, "token_acc": acc, "exact": acc == 1.0}
            if len(tf):
                n = len(it.prompt)
                seq_lps, seq_ids, _ = sequence_logprobs(tf.loc[it.tag])
                lps = np.asarray(seq_lps[n:], dtype=float)
                top1 = [as_ids(t)[:1] for t in seq_ids[n:]]
                row["tf_acc"] = float(np.mean([t == [a] for t, a in zip(top1, it.answer, strict=True)]))
                row["answer_logprob"] = float(lps.mean())
            rows.append(row)
    return pd.DataFrame(rows)


def summary_table(
    runs: QualityRuns, greedy: pd.DataFrame, teacher: pd.DataFrame, ppl: pd.DataFrame, task: pd.DataFrame
) -> pd.DataFrame:
    """One row per label: the headline numbers (see the column names; ``tf_*`` are over the
    continuation positions; ``ci_*`` are 95% bootstrap intervals over prompts / items)."""
    rows = []
    base_ppl = None
    for cfg in runs.configs:
        lab, res = cfg.label, runs.results[cfg.label]
        row: dict[str, Any] = {"label": lab, "kv_cache_dtype": cfg.kv_cache_dtype, "status": res.status}
        if res.ok:
            g = greedy[greedy.label == lab]
            row.update(
                top3_match=g.top3_match.mean(),
                top3_ci=bootstrap_mean_ci(g.top3_match, seed=runs.spec.seed),
                first_div_median=float(np.median(g.first_div_censored)),
                never_diverged=float(g.first_div.isna().mean()),
                prefix_len_mean=g.prefix_len.mean(),
                agreement=g.agreement.mean(),
            )
            t = teacher[(teacher.label == lab) & (teacher.segment == "continuation")] if len(teacher) else teacher
            if len(t):
                row.update(
                    tf_top1=t.top1.mean(),
                    tf_topk=t[f"top{runs.spec.top_k}"].mean(),
                    tf_abs_dlogprob=t.abs_dlogprob.mean(),
                    tf_kl=t.kl.mean(),
                    tf_abs_dlogprob_p99=float(t.abs_dlogprob.quantile(0.99)),
                )
            p = ppl[ppl.label == lab]
            if len(p):
                row["ppl"] = math.exp(p.nll.sum() / p.n_tokens.sum())
                if lab == BASELINE:
                    base_ppl = row["ppl"]
            k = task[task.label == lab]
            if len(k):
                row.update(
                    task_acc=k.token_acc.mean(),
                    task_exact=k.exact.mean(),
                    task_ci=bootstrap_mean_ci(k.token_acc, seed=runs.spec.seed),
                )
                if "tf_acc" in k:
                    row.update(task_tf_acc=k.tf_acc.mean(), task_answer_logprob=k.answer_logprob.mean())
        rows.append(row)
    df = pd.DataFrame(rows).set_index("label")
    seed = runs.spec.seed
    pb = ppl[ppl.label == BASELINE].set_index("window") if len(ppl) else None
    kb = task[task.label == BASELINE].set_index("item") if len(task) else None
    ppl_ci: dict[str, Any] = {}
    task_ci: dict[str, Any] = {}
    task_lp_ci: dict[str, Any] = {}
    for lab in df.index:
        if lab == BASELINE or df.loc[lab, "status"] != "ok":
            continue
        if pb is not None and len(pb):  # paired by window
            pc = ppl[ppl.label == lab].set_index("window").loc[pb.index]
            b, c, n = pb.nll.to_numpy(), pc.nll.to_numpy(), pb.n_tokens.to_numpy()
            ppl_ci[lab] = bootstrap_ci(lambda i, b=b, c=c, n=n: delta_ppl_pct(b[i], c[i], n[i]), len(b), seed=seed)
        if kb is not None and len(kb):  # paired by item
            kc = task[task.label == lab].set_index("item").loc[kb.index]
            task_ci[lab] = bootstrap_mean_ci((kc.token_acc - kb.token_acc).to_numpy(), seed=seed)
            if "answer_logprob" in kc:
                task_lp_ci[lab] = bootstrap_mean_ci((kc.answer_logprob - kb.answer_logprob).to_numpy(), seed=seed)
    df["delta_ppl_pct_ci"] = pd.Series(ppl_ci, dtype=object).reindex(df.index)
    df["delta_task_acc_ci"] = pd.Series(task_ci, dtype=object).reindex(df.index)
    df["delta_task_answer_logprob_ci"] = pd.Series(task_lp_ci, dtype=object).reindex(df.index)
    if base_ppl is not None and "ppl" in df:
        df["delta_ppl"] = df.ppl - base_ppl
        df["delta_ppl_pct"] = 100 * df.delta_ppl / base_ppl  # equals delta_ppl_pct() of the windows' nll
    for col in ("task_acc", "task_tf_acc", "task_answer_logprob"):
        if col in df:
            df[f"delta_{col}"] = df[col] - df[col].get(BASELINE, float("nan"))
    _add_one_pass(runs, df)
    return df


def _add_one_pass(runs: QualityRuns, df: pd.DataFrame) -> None:
    """The secondary, one-pass columns (``tf_top1_one_pass``, ``ppl_one_pass``, ``delta_ppl_pct_one_pass``): the same
    measures scored in one prefill, where a run has those phases. Verdicts never read them."""
    t1 = teacher_table(runs, ONE_PASS["teacher"])
    if len(t1):
        c = t1[t1.segment == "continuation"]
        df["tf_top1_one_pass"] = c.groupby("label").top1.mean().reindex(df.index)
    p1 = ppl_table(runs, ONE_PASS["ppl"])
    if len(p1):
        g = p1.groupby("label")[["nll", "n_tokens"]].sum()
        df["ppl_one_pass"] = np.exp(g.nll / g.n_tokens).reindex(df.index)
        base = df["ppl_one_pass"].get(BASELINE, float("nan"))
        df["delta_ppl_pct_one_pass"] = 100 * (df.ppl_one_pass / base - 1)


def _aligned(runs: QualityRuns, label: str, phase: str) -> np.ndarray:
    """A label's actual-token logprobs over every request of ``phase`` (tags sorted), aligned with the scored
    sequences (NaN where nothing was scored), so both methods and every engine line up position by position."""
    rec = runs.records(label, phase)
    if not len(rec):
        return np.asarray([], dtype=float)
    return np.concatenate([np.asarray(sequence_logprobs(rec.loc[t])[0], dtype=float) for t in sorted(rec.index)])


def scoring_check(runs: QualityRuns, phases: Sequence[str] = ("teacher", "ppl")) -> pd.DataFrame:
    """Does the scoring see the KV quantization? One row per (candidate, method): ``method`` ``cache`` (the
    verdicts' scoring, :mod:`fp8lab.scoring`) or ``one_pass``; over the positions of ``phases`` that both the
    candidate and ``auto`` scored, ``positions``, ``max_abs_dlogprob`` / ``mean_abs_dlogprob`` (nats) and
    ``frac_differ`` (share of positions whose logprob differs from ``auto``'s): a quantized engine whose scores
    equal ``auto``'s everywhere was scored over unquantized K/V. ``gap_*`` (method ``cache`` rows): the same
    engine's one-pass scores against its through-the-cache ones (0 where the one-pass prefill also read the cache).
    ``attention_backend`` the engine used, ``fp8_emulation`` the emulated format (None: native)."""
    rows = []
    for lab in runs.ok_labels:
        if lab == BASELINE:
            continue
        res = runs.results[lab]
        base = {
            "label": lab,
            "attention_backend": (res.engine or {}).get("attention_backend"),
            "fp8_emulation": res.extra.get("emulated"),
        }
        vec = {}
        for method in ("cache", "one_pass"):
            names = [p if method == "cache" else ONE_PASS.get(p, "") for p in phases]
            a = np.concatenate([_aligned(runs, BASELINE, n) for n in names])
            c = np.concatenate([_aligned(runs, lab, n) for n in names])
            vec[method] = c
            if not a.size or a.size != c.size:
                continue
            rows.append({**base, "method": method, **cache_check(a, c)})
        if vec["cache"].size and vec["cache"].size == vec["one_pass"].size:
            gap = cache_check(vec["cache"], vec["one_pass"])
            for r in rows:
                if r["label"] == lab and r["method"] == "cache":
                    r.update({f"gap_{k}": v for k, v in gap.items() if k != "positions"})
    return pd.DataFrame(rows)
