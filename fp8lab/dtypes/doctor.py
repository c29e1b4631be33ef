"""``fp8lab doctor``'s KV-format matrix for this machine: for every ``kv_cache_dtype`` the installed vLLM accepts,
whether it starts here and why not.

Where a Study 08 run of this vLLM version on this device is in the results store, its rows answer (measured: an
engine started, refused or crashed). Otherwise the quick answer needs no engine: vLLM's own backend answer and
fp8lab's capability rule (:func:`fp8lab.dtypes.run.precheck`), which refuse what they can; a dtype neither refuses
is "not refused by vLLM's answer: an engine start decides" until ``fp8lab doctor --probe`` (Study 08 with one small
engine per such dtype) or the study itself measures it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fp8lab.dtypes.run import STUDY, classify, precheck


def stored_rows(device: str, vllm: str | None, root: Path | None = None) -> tuple[list[dict[str, Any]], Path | None]:
    """The rows of the newest complete Study 08 run in the store measured on ``device`` with vLLM ``vllm``."""
    from fp8lab.paths import runs_dir

    best: tuple[str, Path] | None = None
    for prov in ((root or runs_dir()) / STUDY).glob("*/provenance.json"):
        try:
            p = json.loads(prov.read_text())
        except (OSError, ValueError):
            continue
        if p.get("device") == device and p.get("vllm") == vllm and (prov.parent / "complete.json").exists():
            if best is None or p.get("date_utc", "") > best[0]:
                best = (p.get("date_utc", ""), prov.parent)
    if best is None:
        return [], None
    from fp8lab.dtypes.run import load

    return load(best[1]).rows, best[1]


def machine_matrix(model: str | None = None, probe: bool = False, root: Path | None = None) -> dict[str, Any]:
    """``rows``: one per dtype the installed vLLM accepts (``kv_cache_dtype``, ``here``: starts | refused | crashed |
    undecided, ``cause_class``, ``why``, ``source``); ``source_run`` where a stored run answered."""
    from fp8lab import kvmath
    from fp8lab.dtypes.spec import MatrixSpec
    from fp8lab.engine import devices
    from fp8lab.kvformats import allowed_kv_dtypes, installed_choices
    from fp8lab.paths import TINY_MODEL_DIR

    model = model or str(TINY_MODEL_DIR)
    info = installed_choices()
    allowed, where = allowed_kv_dtypes()
    if info is None:
        return {"vllm": None, "rows": [], "note": where}
    prov = devices.provenance(seed=0, with_torch=False)
    if probe:
        from fp8lab.dtypes.run import run_matrix

        spec = MatrixSpec(
            model=model,
            quality_prompts=1,
            quality_prompt_tokens=32,
            quality_gen_tokens=4,
            prefix_prompt_tokens=64,
            prefix_gen_tokens=4,
            decode_contexts=(32,),
            decode_tokens=2,
            decode_reps=1,
        )
        run = run_matrix(spec, root)
        rows, src = run.rows, run.run_dir
    else:
        rows, src = stored_rows(prov.get("device"), info.get("version"), root)
    mla = kvmath.load_layout(model).is_mla
    by = {r["label"]: r for r in rows}
    out = []
    spec = None
    for d in allowed:
        r = by.get(d)
        if r is not None:
            st = r.get("status", "")
            out.append(
                {
                    "kv_cache_dtype": d,
                    "here": "starts" if st == "started" else st,
                    "cause_class": classify(st, r.get("cause") or "", d, mla),
                    "why": r.get("cause"),
                    "source": f"Study 08 run: {r.get('checked') or 'engine start'}",
                }
            )
            continue
        if spec is None:
            spec = MatrixSpec(model=model, kv_dtypes=("auto",))
        pre = precheck(spec, {"kv_cache_dtype": d, "skip_layers": []}, info)
        if pre is not None:
            out.append(
                {
                    "kv_cache_dtype": d,
                    "here": "refused",
                    "cause_class": classify("refused", pre["cause"] or "", d, mla),
                    "why": pre["cause"],
                    "source": pre["checked"],
                }
            )
        else:
            out.append(
                {
                    "kv_cache_dtype": d,
                    "here": "undecided",
                    "cause_class": None,
                    "why": "vLLM's answer does not refuse it: an engine start decides (fp8lab doctor --probe)",
                    "source": "vLLM's answer (no engine started)",
                }
            )
    return {
        "vllm": info.get("version"),
        "device": prov.get("device"),
        "model": model,
        "rows": out,
        "source_run": str(src) if src else None,
    }


def format_matrix(m: dict[str, Any]) -> str:
    if not m["rows"]:
        return f"KV formats: {m.get('note', 'no vLLM installed')}"
    lines = [f"KV formats of vLLM {m['vllm']} on {m['device']} (model {Path(m['model']).name}):"]
    for r in m["rows"]:
        cls = f" [{r['cause_class']}]" if r["cause_class"] else ""
        why = f"{cls} {r['why']}" if r["here"] != "starts" and r["why"] else ""
        lines.append(f"  {r['kv_cache_dtype']:<20} {r['here']:<9} ({r['source']}){why}")
    if m.get("source_run"):
        lines.append(f"  measured rows from {Path(m['source_run']).name} in the results store")
    return "\n".join(lines)
