"""Study 08's verdicts: capacity against fp8lab's formula, and prefix-cache hits against cold with the pool full.
Both are judged on this run's rows that started; a run where nothing but ``auto`` started says so."""

from __future__ import annotations

from typing import Any

from fp8lab.study import Verdict

CAPACITY_CLAIM = (
    "Every KV format that starts holds exactly the blocks fp8lab's formula (vLLM's page-size rules) predicts."
)
PREFIX_CLAIM = "A prefix-cache hit with the block pool full gives the same greedy tokens as the prompt computed cold."


def verdict(table: Any, device: str) -> tuple[Verdict, ...]:
    started = table[table.status == "started"] if len(table) else table
    n = int(len(started))
    if n == 0:
        return (
            Verdict("08.capacity", CAPACITY_CLAIM, "not testable here", f"No format started on {device}.", 0),
            Verdict("08.prefix", PREFIX_CLAIM, "not testable here", f"No format started on {device}.", 0),
        )
    labels = list(started.label)
    exact = [bool(x) for x in started.get("blocks_exact", [False] * n)]
    off = [lab for lab, e in zip(labels, exact, strict=True) if not e]
    cap = Verdict(
        "08.capacity",
        CAPACITY_CLAIM,
        "confirmed" if not off else "refuted",
        (
            f"On {device}, {n} format(s) started ({', '.join(labels)}); the engine's block count equals the formula's "
            f"for {n - len(off)} of {n}" + (f" (not for {', '.join(off)})." if off else ".")
        ),
        n,
    )
    pre = started.get("prefix_hit_equals_cold")
    rows = [(lab, bool(v)) for lab, v in zip(labels, pre if pre is not None else [], strict=False) if v == v]
    bad = [lab for lab, v in rows if not v]
    said = (
        f"On {device}, with the pool about 95% full, a prefix hit gave the cold output for "
        f"{len(rows) - len(bad)} of {len(rows)} started format(s)"
        + (f"; it did not for {', '.join(bad)}." if bad else ".")
    )
    if "auto" in bad:  # the baseline itself differs: hit and cold prefills are not bitwise equal on this backend
        verdict_ = "inconclusive"
        said += (
            " auto itself differs, so on this attention backend a hit and a cold prefill are not bitwise equal "
            "(another kernel path, another summation order), and a difference is not a defect of the format."
        )
    else:
        verdict_ = "not testable here" if not rows else ("confirmed" if not bad else "refuted")
    return cap, Verdict("08.prefix", PREFIX_CLAIM, verdict_, said, len(rows))
