"""Notebook 05's parameters, validated (:class:`AuditSpec`): which report folders, extra summaries and vLLM
introspections the audit reads."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fp8lab.audit.evidence import OPTIONS_GLOB, Evidence, load_evidence, resolve
from fp8lab.specs import SpecError, check_bool


@dataclass(frozen=True)
class AuditSpec:
    """Notebook 05's parameters. ``report_dir``: this profile's report folder (None: ``$FP8LAB_REPORT_DIR``,
    set by ``fp8lab run``, else ``reports/cpu-tiny``); ``other_reports``: other report folders (missing ones are
    noted); ``extra_summaries``: ``{report label: [summary files]}`` rendered elsewhere (e.g. a Study 06 summary
    made with ``fp8lab run 06 --profile h200 --out /tmp/x``); ``vllm_options_files``: glob of saved vLLM
    introspections (None: none); ``introspect_installed``: also inspect the installed vLLM. Relative paths are
    relative to the repository."""

    report_dir: str | None = None
    other_reports: tuple[str, ...] = ("reports/h200", "reports/h200/shipped", "reports/cpu-tiny")
    extra_summaries: Mapping[str, Sequence[str]] = field(default_factory=dict)
    vllm_options_files: str | None = OPTIONS_GLOB
    introspect_installed: bool = True

    PARAMS: ClassVar[Mapping[str, str]] = {
        "REPORT_DIR": "report_dir",
        "OTHER_REPORTS": "other_reports",
        "EXTRA_SUMMARIES": "extra_summaries",
        "VLLM_OPTIONS_FILES": "vllm_options_files",
        "INTROSPECT_INSTALLED": "introspect_installed",
    }

    def __post_init__(self) -> None:
        if self.report_dir is not None and not isinstance(self.report_dir, (str, Path)):
            raise SpecError("AuditSpec", "report_dir", self.report_dir, "a folder path or None")
        if isinstance(self.other_reports, (str, Path)) or not all(
            isinstance(p, (str, Path)) for p in self.other_reports
        ):
            raise SpecError("AuditSpec", "other_reports", self.other_reports, "a list of folder paths")
        object.__setattr__(self, "other_reports", tuple(str(p) for p in self.other_reports))
        es = self.extra_summaries
        if es is None:
            es = {}
        if not isinstance(es, Mapping) or not all(
            isinstance(k, str) and not isinstance(v, (str, Path)) and all(isinstance(p, (str, Path)) for p in v)
            for k, v in es.items()
        ):
            raise SpecError("AuditSpec", "extra_summaries", es, "a mapping {report label: [summary file paths]}")
        object.__setattr__(self, "extra_summaries", {k: [str(p) for p in v] for k, v in es.items()})
        if self.vllm_options_files is not None and not isinstance(self.vllm_options_files, str):
            raise SpecError("AuditSpec", "vllm_options_files", self.vllm_options_files, "a glob pattern or None")
        check_bool("AuditSpec", "introspect_installed", self.introspect_installed)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AuditSpec:
        kw = {
            f: (tuple(params[n]) if isinstance(params[n], list) else params[n])
            for n, f in cls.PARAMS.items()
            if n in params
        }
        return cls(**kw)

    def resolved_report_dir(self) -> Path:
        return resolve(self.report_dir or os.environ.get("FP8LAB_REPORT_DIR") or "reports/cpu-tiny")

    def evidence(self) -> Evidence:
        return load_evidence(
            self.resolved_report_dir(),
            self.other_reports,
            self.vllm_options_files,
            self.introspect_installed,
            extra_summaries=self.extra_summaries,
        )
