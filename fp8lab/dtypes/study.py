"""Study 08 on the study contract (:mod:`fp8lab.study`)::

from fp8lab.dtypes import study as s08

spec = s08.Spec.from_params(globals())
res = s08.run(spec)
res.tables()["matrix"], res.summary(), res.verdict(), res.markdown()
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.dtypes.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.dtypes.quality import METHOD
from fp8lab.dtypes.run import MatrixRun, run_matrix
from fp8lab.dtypes.spec import MatrixSpec
from fp8lab.dtypes.summary import summary
from fp8lab.dtypes.tables import decode, layers, matrix
from fp8lab.dtypes.verdict import verdict
from fp8lab.study import Verdict

NAME = "08_kv_dtype_matrix"


class Spec(MatrixSpec):
    """:class:`~fp8lab.dtypes.spec.MatrixSpec` built from a notebook's UPPER_CASE names only."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> MatrixSpec:
        return MatrixSpec.from_params({k: v for k, v in params.items() if isinstance(k, str) and k.isupper()})


@dataclass
class Results:
    """A stored Study 08 run and the spec it measured; tables, summary and verdicts computed once."""

    run: MatrixRun
    spec: MatrixSpec

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        return {"matrix": matrix(self.run), "decode": decode(self.run), "layers": layers(self.run)}

    def tables(self) -> dict[str, Any]:
        return dict(self._tables)

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary(self.run, self._tables["matrix"])

    def summary(self) -> dict[str, Any]:
        return dict(self._summary)

    def verdict(self) -> tuple[Verdict, ...]:
        return verdict(self._tables["matrix"], self._summary["device"])

    def markdown(self) -> str:
        s = self._summary
        t = self._tables["matrix"]
        gpu = "cpu" not in str(s["device"]).lower() and "cpu" not in str(s.get("vllm_version", "")).lower()
        lines = [
            f"**{s['n_rows']} rows** on {s['device']} (vLLM {s['vllm_version']}, model {s['model']}, "
            f"{s['kv_cache_gib']:g} GiB of KV per engine): **{s['n_started']} started**, {s['n_refused']} refused, "
            f"{s['n_crashed']} crashed."
        ]
        for cls_ in ("not on this device", "not for this model", "engine bug"):
            labs = list(t.label[t.cause_class == cls_]) if len(t) else []
            if labs:
                lines.append(f"- {cls_}: {', '.join(labs)}")
        for v in self.verdict():
            lines.append(f"- **{v.verdict}**: {v.sentence}")
        lines.append(
            f"- Quality columns (Δppl %, top-1 agreement, greedy identical) rest on: {s.get('quality_method', METHOD)}; "
            f"model {s['model']}."
        )
        if not gpu:
            lines.append("- Decode ratios here are recorded on a shared CPU without CUDA graphs: not a speed verdict.")
        return "\n".join(lines)


def run(spec: MatrixSpec, store: Path | None = None) -> Results:
    return Results(run_matrix(spec, store), spec)
