"""Settings-matched verdicts: the setting a claim was made in (:class:`ClaimSetting`, structured by dimension), the
setting of a piece of evidence on the same dimensions (:func:`evidence_dims`, from
:class:`~fp8lab.audit.evidence.Setting`), and where the two differ on a dimension that can change the claim's answer
(:func:`mismatches`). A rule's confirmation or refutation from evidence whose setting differs on such a dimension is
capped at ``not reproduced here`` (:func:`~fp8lab.audit.scale.decide`), naming the mismatch.

The dimensions (:data:`DIMENSIONS`):

- ``intervention``: what FP8 is applied to: ``KV only`` (``--kv-cache-dtype fp8``, all fp8lab runs) or
  ``FP8 weights + KV`` (``--quantization fp8`` as well: seed 003's "FP8");
- ``engine``: ``vLLM`` | ``SGLang``;
- ``device``: the device class: ``A100`` (Ampere, no FP8 Tensor Cores), ``Hopper`` (H100 / H200), ``CPU``;
- ``load``: ``open-loop rate`` (requests arrive on a schedule), ``closed-loop concurrency`` (a fixed number of
  clients), ``offline batch`` (a fixed batch or single requests, timed per step or per request);
- ``scale``: the model's size class: ``tiny`` (< 1B parameters: the shipped 6.8M model), ``mid`` (1-30B: the 8B
  dummy-weight shape, Qwen3-14B), ``large`` (> 30B: Llama-2-70B, Llama-3-70B).

A claim's value ``unstated`` (the seed did not say) on a dimension that matters is a mismatch too: evidence from
a known setting cannot stand for an unknown one. Which dimensions matter is the claim's own (``ClaimSetting.matters``):
a claim that FP8 halves the KV bytes does not depend on the GPU; a claimed throughput change depends on all five.
Physics, arithmetic, documented facts, introspection of the installed vLLM and computations with torch carry no
evidence setting and are never capped (:data:`SETTING_FREE`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fp8lab.audit import pages

#: The dimensions of a setting, in the order they are named.
DIMENSIONS: tuple[str, ...] = ("intervention", "engine", "device", "load", "scale")
UNSTATED = "unstated"
KV_ONLY, WEIGHTS_KV = "KV only", "FP8 weights + KV"
OPEN_LOOP, CLOSED_LOOP, OFFLINE = "open-loop rate", "closed-loop concurrency", "offline batch"
#: How each study loads the engine (its evidence's ``load``), by its page's name (:mod:`fp8lab.audit.pages`): the
#: serving study's closed-loop sweep (its open loop is named by the rule that reads it), the prefix-cache study's
#: multi-turn clients, the others a fixed batch or single requests.
STUDY_LOAD: Mapping[str, str] = {
    pages.KV_MEMORY: OFFLINE,
    pages.SERVING: CLOSED_LOOP,
    pages.CALIBRATION: OFFLINE,
    pages.QUALITY: OFFLINE,
    pages.LONG_CONTEXT: OFFLINE,
    pages.DECODE: OFFLINE,
    pages.PREFIX: CLOSED_LOOP,
}
#: Parameter counts (billions) of the models fp8lab runs, by folder name, where the name does not say it.
MODEL_BILLIONS: Mapping[str, float] = {"fp8lab-tiny-qwen3": 0.0068}


@dataclass(frozen=True)
class ClaimSetting:
    """Where a claim was made: ``seed`` (the field report: ``000``, ``002``, ``003``, or several), and per
    dimension of :data:`DIMENSIONS` the seed's value or ``unstated``; ``scale`` is the model (``Qwen3-14B``,
    ``Llama-2-70B``) or its size in billions of parameters; ``matters``: the dimensions on which a different
    setting can change the claim's answer (a mismatch there caps the verdict)."""

    seed: str = UNSTATED
    intervention: str = UNSTATED
    engine: str = UNSTATED
    device: str = UNSTATED
    load: str = UNSTATED
    scale: str = UNSTATED
    matters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [m for m in self.matters if m not in DIMENSIONS]
        if bad:
            from fp8lab.specs import SpecError

            raise SpecError("ClaimSetting", "matters", bad, "allowed: " + " | ".join(DIMENSIONS))

    @property
    def text(self) -> str:
        """``seed 000: KV only, vLLM, GPU unstated, closed-loop concurrency, Qwen3-14B``."""
        parts = [
            f"{self.intervention} FP8" if self.intervention != UNSTATED else "FP8 intervention unstated",
            self.engine if self.engine != UNSTATED else "engine unstated",
            self.device if self.device != UNSTATED else "GPU unstated",
            self.load if self.load != UNSTATED else "load unstated",
            self.scale if self.scale != UNSTATED else "model unstated",
        ]
        return f"seed {self.seed}: " + ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, **{d: getattr(self, d) for d in DIMENSIONS}, "matters": list(self.matters)}


def device_class(device: str | None) -> str:
    """``Hopper`` (H100, H200, GH200), ``A100``, ``CPU``, or the device name itself; ``unstated`` for None."""
    if not device:
        return UNSTATED
    d = str(device).upper()
    if d.startswith("CPU"):
        return "CPU"
    if re.search(r"\b(GH|H)(100|200)\b", d):
        return "Hopper"
    if "A100" in d:
        return "A100"
    return str(device)


def billions(model: str | None) -> float | None:
    """A model's parameter count in billions: :data:`MODEL_BILLIONS`, else from its name (``qwen3-8b`` -> 8,
    ``Llama-2-70B`` -> 70); None when unknown."""
    if not model:
        return None
    if model in MODEL_BILLIONS:
        return MODEL_BILLIONS[model]
    m = re.search(r"(\d+(?:\.\d+)?)\s*b(?![a-z])", str(model).lower())
    return float(m.group(1)) if m else None


def scale_class(model: str | None) -> str:
    """``tiny`` (< 1B), ``mid`` (1-30B), ``large`` (> 30B), ``unstated`` (unknown)."""
    b = billions(model)
    if b is None:
        return UNSTATED
    return "tiny" if b < 1 else "mid" if b <= 30 else "large"


def evidence_dims(setting: Any) -> dict[str, str]:
    """The dimensions of an evidence :class:`~fp8lab.audit.evidence.Setting`: fp8lab runs vLLM with FP8 applied to
    the KV cache only; the device class from its device; its load; its model's size class."""
    return {
        "intervention": KV_ONLY,
        "engine": "vLLM",
        "device": device_class(getattr(setting, "device", None)),
        "load": getattr(setting, "load", None) or UNSTATED,
        "scale": scale_class(getattr(setting, "model", None)),
    }


def mismatches(claim: ClaimSetting, setting: Any) -> list[str]:
    """The dimensions of ``claim.matters`` on which the evidence's ``setting`` differs from the claim's, each as
    ``"<dimension>: claim <value>, evidence <value>"`` (an ``unstated`` claim value differs from any evidence)."""
    ev = evidence_dims(setting)
    out = []
    for dim in claim.matters:
        want = getattr(claim, dim)
        have = ev[dim]
        if dim == "scale":
            same = want != UNSTATED and scale_class(want) == have
        elif dim == "load":
            same = want != UNSTATED and want.startswith(have)
        else:
            same = want != UNSTATED and want == have
        if not same:
            shown = f"{want} ({scale_class(want)})" if dim == "scale" and want != UNSTATED else want
            out.append(f"{dim}: claim {shown}, evidence {have}")
    return out


def match_text(claim: ClaimSetting, setting: Any) -> str:
    """One line: ``matches on device, load`` / ``mismatch on device (claim A100, evidence Hopper)`` /
    ``no dimension matters``."""
    if not claim.matters:
        return "no setting dimension changes this claim's answer"
    mm = mismatches(claim, setting)
    if mm:
        return "mismatch on " + "; ".join(mm)
    return "matches on " + ", ".join(claim.matters)
