"""Study 07's key numbers (:func:`summary`: what the notebook records and the claims audit reads), from a
stored run through the tables and the prediction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fp8lab.prefix.predict import plan
from fp8lab.prefix.run import PrefixRun
from fp8lab.prefix.tables import cell_table, correctness_table, knee_table, sweep_table
from fp8lab.prefix.verdict import _isnan, _records, claim_evidence, claim_verdict


def summary(run: PrefixRun, base: str = "auto", other: str = "fp8") -> dict[str, Any]:
    """The study's key numbers (what the notebook records and the audit reads)."""
    spec = run.spec
    pred = plan(spec)
    cells = cell_table(run.rows)
    sweep = sweep_table(cells, pred, base, other)
    knees = knee_table(run, sweep)
    corr = correctness_table(run.correctness)
    prov = run.provenance
    ok = {d: run.engines.get(d, {}).get("status", "not started") for d in spec.kv_dtypes}
    s: dict[str, Any] = {
        "device": prov.get("device"),
        "vllm_version": prov.get("vllm"),
        "fp8lab_commit": prov.get("commit"),
        "model": Path(spec.model).name,
        "load_format": spec.load_format,
        "prompt_source": spec.prompt_source,
        "kv_cache_gib": spec.kv_cache_gib,
        "block_size": spec.effective_block_size(),
        "trials": spec.trials,
        "max_in_flight": spec.max_in_flight,
        "active": list(spec.active),
        "complete": run.complete,
        "engines_status": ok,
        "engine_errors": {d: e.get("error") for d, e in run.engines.items() if e.get("status") != "ok"},
        "num_blocks": {d: e.get("num_blocks") for d, e in run.engines.items() if e.get("status") == "ok"},
        "num_blocks_formula": {d: spec.num_blocks(d) for d in spec.kv_dtypes},
        "knees": _records(knees),
        "sweep": _records(sweep),
        "correctness": _records(corr),
        "counter_turns": int(cells.counter_turns.sum()) if len(cells) else 0,
        "counter_turns_complete": int(cells.counter_turns_complete.sum()) if len(cells) else 0,
    }
    s["num_blocks_exact"] = bool(s["num_blocks"]) and all(
        s["num_blocks"][d] == s["num_blocks_formula"][d] for d in s["num_blocks"]
    )
    if len(sweep) and "ttft_detectable_pct" in sweep:
        hw = sweep.ttft_detectable_pct.dropna()
        s["ttft_min_detectable_pct"] = float(hw.median()) if len(hw) else None
        dh = ((sweep.dhit_pp_ci_high - sweep.dhit_pp_ci_low) / 2).dropna()
        s["dhit_min_detectable_pp"] = float(dh.median()) if len(dh) else None
    # the claim's numbers: hit rates where both hold (inside auto's knee) and where fp8's extra hits show
    for w in spec.workloads:
        g = sweep[sweep.workload == w.kind] if len(sweep) else sweep
        if not len(g) or f"{base}_hit_rate" not in g:
            continue
        s[f"{w.kind}.max_abs_dhit_pp_inside"] = None
        s[f"{w.kind}.gain"] = None
        kb = knees[(knees.workload == w.kind) & (knees.kv_dtype == base)]
        kb_last = kb.measured_last_held.iloc[0] if len(kb) else None
        if "dhit_pp" in g:
            inside = g[g.n_active <= (kb_last if kb_last is not None and not _isnan(kb_last) else 0)]
            if len(inside):
                s[f"{w.kind}.max_abs_dhit_pp_inside"] = float(inside.dhit_pp.abs().max())
            beyond = g[(g.n_active > (kb_last if kb_last is not None and not _isnan(kb_last) else 0))]
            beyond = beyond.dropna(subset=["dhit_pp"])
            if len(beyond):
                best = beyond.loc[beyond.dhit_pp.idxmax()]
                s[f"{w.kind}.gain"] = {
                    k: (None if _isnan(v) else float(v))
                    for k, v in best.items()
                    if k
                    in (
                        "n_active",
                        "dhit_pp",
                        "dhit_pp_ci_low",
                        "dhit_pp_ci_high",
                        f"{base}_hit_rate",
                        f"{other}_hit_rate",
                        "ttft_ratio",
                        "ttft_ratio_ci_low",
                        "ttft_ratio_ci_high",
                        "tput_ratio",
                    )
                }
    s["claim_verdict"] = claim_verdict(s, base, other)
    s["claim_evidence"] = claim_evidence(s, base, other)
    return s
