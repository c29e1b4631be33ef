"""The rules of the documented facts and vLLM's options: the invented options (15, :func:`options_table`), FP8 on
A100 and Ada (18, 19), the vLLM versions (25) and CUDA graph recapture (26)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from fp8lab.audit.evidence import Evidence
from fp8lab.audit.scale import CONFIRMED, FACT, INCONCLUSIVE, INTROSPECTION, NOT_TESTABLE, REFUTED, Finding, rule

# --------------------------------------------------------------------------------------------- claim 15
CLAIM15_OPTIONS = (
    "--fp8-padding-threshold",
    "--fp8-w8a16",
    "--quant-aware",
    "--fp8-use-matrix",
    "--attention-reduction",
    "--max-num-prompt-tokens",
)
#: A request header could switch a request's KV dtype only if its name says so.
DTYPE_HEADER_WORDS = ("dtype", "fp16", "float16", "half", "precision", "fp8", "kv-cache", "kv_cache")


def option_exists(info: Mapping[str, Any], flag: str) -> bool:
    """``flag`` is a ``vllm serve`` flag of this version, or (dashes to underscores) an ``EngineArgs`` field."""
    return flag in (info.get("serve_flags") or []) or flag[2:].replace("-", "_") in (info.get("engine_args") or [])


def dtype_headers(info: Mapping[str, Any]) -> list[str]:
    return [h for h in info.get("request_headers") or [] if any(w in h.lower() for w in DTYPE_HEADER_WORDS)]


def options_table(ev: Evidence) -> list[dict[str, Any]]:
    """One row per named option and vLLM version: exists, and the closest real flag of that version."""
    rows = []
    for info in ev.vllm:
        for flag in CLAIM15_OPTIONS:
            near = difflib.get_close_matches(flag, info.get("serve_flags") or [], n=1, cutoff=0.6)
            rows.append(
                {
                    "vllm": info.get("version"),
                    "option": flag,
                    "exists": option_exists(info, flag),
                    "closest real flag": near[0] if near else None,
                }
            )
        rows.append(
            {
                "vllm": info.get("version"),
                "option": "request header switching a request to FP16",
                "exists": bool(dtype_headers(info)),
                "closest real flag": "headers read: " + ", ".join(info.get("request_headers") or []),
            }
        )
    return rows


@rule("15")
def rule_options(ev: Evidence) -> Finding:
    """Against every inspected vLLM version (the installed one introspected live, and saved
    vllm-options-*.json): an option exists when it is a `vllm serve` flag or an EngineArgs field; a request
    header could switch a request to FP16 only if one the server reads names a dtype (dtype, fp16, half,
    precision, fp8, kv-cache). None exists in any version -> refuted; all exist in every version -> confirmed;
    otherwise inconclusive (it depends on the version)."""
    if not ev.vllm:
        return Finding(NOT_TESTABLE, "no vLLM introspected", "install vLLM or save vllm-options-<version>.json")
    exists, text = {}, []
    for info in ev.vllm:
        v = str(info.get("version"))
        have = {f: option_exists(info, f) for f in CLAIM15_OPTIONS}
        exists[v] = {**have, "header": bool(dtype_headers(info))}
        text.append(
            f"vLLM {v} ({len(info.get('serve_flags') or [])} serve flags, {len(info.get('engine_args') or [])} "
            f"EngineArgs fields): "
            + (", ".join(f for f, h in have.items() if h) or "none of the options")
            + " exist; headers read: "
            + ", ".join(info.get("request_headers") or [])
        )
    flat = [x for d in exists.values() for x in d.values()]
    versions = ", ".join(exists)
    if not any(flat):
        verdict, on = REFUTED, "none of the named options nor a dtype-switching header exists in any inspected version"
    elif all(flat):
        verdict, on = CONFIRMED, "every option exists in every inspected version"
    else:
        verdict = INCONCLUSIVE
        on = "it depends on the version: " + "; ".join(
            f"{v}: " + ", ".join(k for k, h in d.items() if h) for v, d in exists.items()
        )
    return Finding(
        verdict,
        "; ".join(text),
        on,
        {"exists": exists, "versions": list(exists)},
        {},
        f"vLLM {versions} (introspected)",
        "exact (option lists)",
        INTROSPECTION,
        f"None of the six vLLM options the reports name exists (vLLM {versions})." if verdict == REFUTED else "",
    )


# --------------------------------------------------------------------------------------------- claims 18, 19
#: NVIDIA architectures and whether their Tensor Cores execute FP8 (E4M3/E5M2), with the documents that say so.
GPU_FP8_FACTS: Mapping[str, Mapping[str, Any]] = {
    "A100": {
        "architecture": "Ampere",
        "compute_capability": "8.0",
        "fp8_tensor_cores": False,
        "source": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): Tensor Core precisions TF32, BF16, "
        "FP16, FP64, INT8, INT4, binary; no FP8",
    },
    "Ada (L4, L40S, RTX 4090)": {
        "architecture": "Ada Lovelace",
        "compute_capability": "8.9",
        "fp8_tensor_cores": True,
        "source": "NVIDIA Ada GPU Architecture whitepaper (2022): fourth-generation Tensor "
        "Cores with FP8 (E4M3, E5M2) and the Transformer Engine",
    },
    "H100 / H200": {
        "architecture": "Hopper",
        "compute_capability": "9.0",
        "fp8_tensor_cores": True,
        "source": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): FP8 Tensor Cores",
    },
}


def _fact_rule(gpu: str, claimed: bool, text: str) -> Finding:
    f = GPU_FP8_FACTS[gpu]
    v = CONFIRMED if f["fp8_tensor_cores"] == claimed else REFUTED
    return Finding(
        v,
        f"{gpu}: {f['architecture']}, compute capability {f['compute_capability']}, FP8 Tensor Cores: "
        f"{'yes' if f['fp8_tensor_cores'] else 'no'}",
        f"{text} Source: {f['source']}.",
        {"fact": dict(f)},
        {},
        "hardware documentation",
        "exact (a documented fact)",
        FACT,
    )


@rule("18")
def rule_a100_e4m3(ev: Evidence) -> Finding:
    """From :data:`GPU_FP8_FACTS` (NVIDIA's architecture whitepapers): the claim holds only if the A100's Tensor
    Cores execute FP8. FP8 KV still runs on an A100 in vLLM, stored as bytes and converted in software."""
    return _fact_rule(
        "A100",
        True,
        "FP8 Tensor Cores arrived with Ada (8.9) and Hopper (9.0); on an A100 FP8 KV is "
        "stored as FP8 and converted to 16-bit for the math.",
    )


@rule("19")
def rule_ada_fp8(ev: Evidence) -> Finding:
    """From :data:`GPU_FP8_FACTS`: the claim ("lacks FP8 acceleration") holds only if Ada's Tensor Cores do not
    execute FP8."""
    return _fact_rule("Ada (L4, L40S, RTX 4090)", False, "Ada's Tensor Cores execute FP8.")


# --------------------------------------------------------------------------------------------- claim 25
@rule("25")
def rule_vllm_versions(ev: Evidence) -> Finding:
    """vLLM's releases are numbered 0.x (every version inspected here, and every release on PyPI to date); a
    "vLLM 2.3/2.4" would need major version 2. Refuted when every inspected version has major version 0 (2.3 and
    2.4 are PyTorch's numbers of 2024, the likely mix-up); not testable without an inspected version."""
    vs = [str(i.get("version")) for i in ev.vllm if i.get("version")]
    if not vs:
        return Finding(NOT_TESTABLE, "no vLLM introspected", "install vLLM or save vllm-options-<version>.json")
    majors = {v.split(".")[0] for v in vs}
    v = REFUTED if majors == {"0"} else INCONCLUSIVE
    return Finding(
        v,
        f"inspected vLLM versions: {', '.join(vs)} (major {', '.join(sorted(majors))})",
        "vLLM has no 2.x release; torch 2.3/2.4 (2024) are the likely source of the numbers",
        {"versions": vs},
        {},
        f"vLLM {', '.join(vs)} (introspected)",
        "exact",
        INTROSPECTION,
    )


# --------------------------------------------------------------------------------------------- claim 26
CAPTURE_SIZE_ARGS = (
    "cudagraph_capture_sizes",
    "cuda_graph_sizes",
    "max_cudagraph_capture_size",
    "max_seq_len_to_capture",
)


@rule("26")
def rule_graph_recapture(ev: Evidence) -> Finding:
    """vLLM captures CUDA graphs once, at engine start, for a fixed list of batch sizes, and pads a batch to the
    next captured size. Per inspected version: an EngineArgs field that sets that list (cudagraph_capture_sizes,
    cuda_graph_sizes, max_cudagraph_capture_size) shows the sizes are fixed at start -> refuted; none -> not
    testable here."""
    per = {str(i.get("version")): [a for a in CAPTURE_SIZE_ARGS if a in (i.get("engine_args") or [])] for i in ev.vllm}
    if not per:
        return Finding(NOT_TESTABLE, "no vLLM introspected", "install vLLM or save vllm-options-<version>.json")
    fixed = {v: a for v, a in per.items() if a}
    if not fixed:
        return Finding(NOT_TESTABLE, "no capture-size option in " + ", ".join(per), "", {"args": per})
    return Finding(
        REFUTED,
        "; ".join(f"vLLM {v}: EngineArgs {', '.join(a)}" for v, a in fixed.items()),
        "graphs are captured at start-up for a configured list of batch sizes and reused (a batch is padded "
        "to the next captured size), not re-captured when the batch changes",
        {"args": per},
        {},
        "vLLM " + ", ".join(fixed) + " (introspected)",
        "exact (option lists)",
        INTROSPECTION,
    )
