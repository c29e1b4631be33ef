"""What the audit reads (:class:`Evidence`): report folders (:class:`Report`: each study's summary and typed rows,
the folder's ``summary.json``), the setting each study ran in (:class:`Setting`, :func:`study_setting`, read from
the summary, ``summary.json`` or the committed records), vLLM introspections and model configs; and how they are
loaded (:func:`load_report`, :func:`load_options`, :func:`load_evidence`). :class:`Missing` is what a reader raises
when a number a rule needs is not recorded."""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import kvmath, summary_table
from fp8lab.audit import match, pages
from fp8lab.paths import CONFIGS_DIR, REPO_ROOT, TINY_MODEL_NAME


# ------------------------------------------------------------------------------------------------ evidence
class Missing(LookupError):
    """Evidence a rule needs is not in the records (a study not run for a profile, a number not recorded)."""


@dataclass(frozen=True)
class Setting:
    """Where a piece of evidence was measured: ``device`` (``NVIDIA H200``, ``CPU: ...``), ``model`` (folder
    name), ``vllm`` (version), ``graphs`` (CUDA graphs on: True, eager: False, unknown: None), ``load_format``
    and ``source`` (where these were read)."""

    device: str | None = None
    model: str | None = None
    vllm: str | None = None
    graphs: bool | None = None
    load_format: str | None = None
    source: str = ""
    #: how the study loaded the engine (:data:`fp8lab.audit.match.STUDY_LOAD`): open-loop rate, closed-loop
    #: concurrency or offline batch; None when unknown
    load: str | None = None

    @property
    def kind(self) -> str | None:
        """``gpu`` | ``cpu`` | None (unknown)."""
        if not self.device:
            return None
        return "cpu" if str(self.device).upper().startswith("CPU") else "gpu"

    @property
    def tiny(self) -> bool:
        """The shipped 6.8M-parameter model (an analogue for any claim about a full-size model's speed)."""
        return self.model == TINY_MODEL_NAME

    def qualifies(self, needs: str) -> bool:
        if needs == "any":
            return True
        if needs == "gpu":
            return self.kind == "gpu"
        if needs == "gpu-model":
            return self.kind == "gpu" and not self.tiny and self.model is not None
        return False  # "sglang": no SGLang run here

    @property
    def text(self) -> str:
        mode = {True: "CUDA graphs", False: "eager"}.get(self.graphs, "graphs unknown")
        weights = " (dummy weights)" if self.load_format == "dummy" else ""
        load = f", {self.load}" if self.load else ""
        return (
            f"{self.device or 'device unknown'}, {self.model or 'model unknown'}{weights}, vLLM {self.vllm or '?'}, "
            f"KV-only FP8, {mode}{load}"
        )


@dataclass(frozen=True)
class Report:
    """One report folder: ``label``, ``path``, ``summaries`` ``{notebook stem: recorded summary}`` of its studies
    (``NN_*.summary.json``) and ``index`` (the folder's ``summary.json``: per notebook ``ran_on`` and
    ``parameters``)."""

    label: str
    path: Path
    summaries: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    index: Mapping[str, Any] = field(default_factory=dict)
    #: ``{notebook stem: typed summary rows}`` (:mod:`fp8lab.summary_table`) of the studies that wrote a rows file
    #: beside their summary; a study rendered before the typed table has none (its flat summary is read instead).
    rows: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    def stem(self, study: str) -> str | None:
        """The page stem of ``study`` in this report (``06_decode_speed`` for ``decode_speed``: a study is named by
        its page's name without the number, :mod:`fp8lab.audit.pages`, or by a whole page stem), or None."""
        return pages.find(self.summaries, study)

    def number(self, study: str) -> str | None:
        """The study number ``study``'s page shows here: its summary's page's, else (no summary here) its index
        entry's, else its notebook's (:func:`fp8lab.audit.pages.number`); None when nothing names it."""
        return pages.number(study, self.summaries, (self.index.get("notebooks") or {}))

    def label_of(self, study: str) -> str:
        """``decode speed (06)``: ``study`` in messages, with the number its page shows here."""
        return pages.label(study, self.number(study))

    def study(self, study: str) -> Mapping[str, Any]:
        """``study``'s summary; raises :class:`Missing` when the study has no summary here."""
        stem = self.stem(study)
        if stem is None:
            raise Missing(f"no {self.label_of(study)} summary")
        return self.summaries[stem]

    def optional(self, study: str) -> Mapping[str, Any] | None:
        stem = self.stem(study)
        return None if stem is None else self.summaries[stem]

    def study_rows(self, study: str) -> Sequence[Mapping[str, Any]] | None:
        """``study``'s typed rows, or None when its summary has no rows file beside it (or no summary)."""
        stem = self.stem(study)
        return None if stem is None else self.rows.get(stem)

    def setting(self, study: str) -> Setting:
        """The setting of ``study`` here (see the module docstring for where it is read)."""
        return study_setting(self, study)


@functools.lru_cache(maxsize=64)
def _records_facts(archive: str) -> dict[str, Any]:
    """The first ``provenance.json`` and ``spec.json`` of a committed records archive (device, vLLM, model,
    enforce_eager, load_format); ``{}`` when it holds none or cannot be read."""
    out: dict[str, Any] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar:
                name = m.name.rsplit("/", 1)[-1]
                if name not in ("provenance.json", "spec.json") or name in out or not m.isfile():
                    continue
                f = tar.extractfile(m)
                if f is not None:
                    out[name] = json.loads(f.read())
                if len(out) == 2:
                    break
    except (OSError, tarfile.TarError, ValueError):
        return {}
    prov, spec = out.get("provenance.json") or {}, out.get("spec.json") or {}
    eng = spec.get("engine") or spec
    return {
        "device": prov.get("device"),
        "vllm": prov.get("vllm"),
        "model": eng.get("model"),
        "enforce_eager": eng.get("enforce_eager"),
        "load_format": eng.get("load_format"),
    }


def study_setting(rep: Report, study: str) -> Setting:
    """Device, model, vLLM version and CUDA graphs of ``study`` (a name of :mod:`fp8lab.audit.pages` or a page stem)
    in ``rep``: the study's own summary (the decode study records them), the report's ``summary.json`` entry
    (``ran_on``, ``parameters``), the report's committed records (``records/<its number>_*.tar.gz``) and, last, the
    report's own provenance (the machine that rendered it)."""
    stem = rep.stem(study)
    num = rep.number(study)
    s = rep.summaries.get(stem, {}) if stem else {}
    e = ((rep.index.get("notebooks") or {}).get(stem) or {}) if stem else {}
    ran, params = e.get("ran_on") or {}, e.get("parameters") or {}
    # the engine runs the notebook showed (their own provenance, fp8lab.engine.results.note_run) before where the notebook
    # itself executed: a report re-rendered from a committed store on a CPU still shows the H200's runs
    runs = e.get("runs") or {}
    run_device = runs["devices"][0] if len(runs.get("devices") or []) == 1 else None
    run_vllm = runs["vllm"][0] if len(runs.get("vllm") or []) == 1 else None
    device = s.get("device") or run_device or ran.get("device")
    vllm = s.get("vllm_version") or (run_vllm if run_device else None) or ran.get("vllm")
    model = s.get("model") or (Path(str(params["MODEL"])).name if params.get("MODEL") else None)
    graphs = (
        s.get("cuda_graphs")
        if isinstance(s.get("cuda_graphs"), bool)
        else (not params["ENFORCE_EAGER"] if isinstance(params.get("ENFORCE_EAGER"), bool) else None)
    )
    load_format = s.get("load_format") or params.get("LOAD_FORMAT")
    sources = ["summary" if s.get("device") else "runs' provenance" if run_device else "summary.json" if ran else ""]
    if (device is None or vllm is None or graphs is None) and num:
        for archive in sorted(glob.glob(str(rep.path / "records" / f"{num}_*.tar.gz"))):
            facts = _records_facts(archive)
            if facts:
                device, vllm = device or facts["device"], vllm or facts["vllm"]
                model = model or (Path(str(facts["model"])).name if facts.get("model") else None)
                if graphs is None and isinstance(facts.get("enforce_eager"), bool):
                    graphs = not facts["enforce_eager"]
                load_format = load_format or facts.get("load_format")
                sources.append(f"records/{Path(archive).name}")
                break
    if device is None:
        prov = rep.index.get("provenance") or {}
        device, vllm = prov.get("device"), vllm or prov.get("vllm")
        if device:
            sources.append("report provenance")
    if device and str(device).upper().startswith("CPU"):
        graphs = False  # the CPU build has no CUDA graphs
    return Setting(
        device,
        model,
        vllm,
        graphs,
        load_format,
        ", ".join(x for x in sources if x),
        match.STUDY_LOAD.get(pages.page_name(study)),
    )


@dataclass(frozen=True)
class Evidence:
    """Everything the rules read: ``reports`` (this profile's first), ``vllm`` (one introspection per vLLM
    version, each with a ``source``), ``configs`` (model layouts for the arithmetic claims), ``formats`` (FP8
    format facts, :func:`format_facts` when None), ``base_dir`` (links are relative to it) and ``notes``."""

    reports: tuple[Report, ...] = ()
    vllm: tuple[Mapping[str, Any], ...] = ()
    configs: tuple[kvmath.KVLayout, ...] = ()
    formats: Mapping[str, Mapping[str, float]] | None = None
    base_dir: Path = REPO_ROOT
    notes: tuple[str, ...] = ()

    def config(self, name: str) -> kvmath.KVLayout | None:
        return next((c for c in self.configs if c.name == name), None)

    def number(self, study: str) -> str | None:
        """The study number ``study``'s page shows in the first report that has one, else its notebook's."""
        return pages.number(study, *(r.summaries for r in self.reports))


# ====================================================================================== loading evidence
SUMMARY_GLOB = "[0-9][0-9]_*.summary.json"
OPTIONS_GLOB = "reports/*/vllm-options-*.json"


def resolve(p: str | Path) -> Path:
    p = Path(p)
    return p if p.is_absolute() else REPO_ROOT / p


def report_label(path: Path) -> str:
    """A report folder's label: its name, with its parent's for a folder nested in a profile's report
    (``reports/h200/shipped`` -> ``h200/shipped``)."""
    return f"{path.parent.name}/{path.name}" if path.parent.parent.name == "reports" else path.name


def load_report(path: str | Path, label: str | None = None, extra: Iterable[str | Path] = ()) -> Report:
    """A report folder's study summaries (``NN_*.summary.json``; an audit's own summary is left out), its
    ``summary.json`` (the runner's index: ``ran_on``, ``parameters``), and ``extra`` summary files (e.g. a Study 06
    summary rendered elsewhere), each under its file's stem; with each summary its typed rows where a rows file
    stands beside it (``<stem>.rows.json``, validated on read: a file that does not fit the schema raises)."""
    path = resolve(path)
    sums, rows = {}, {}
    for f in [*sorted(path.glob(SUMMARY_GLOB)), *map(resolve, extra)]:
        s = json.loads(Path(f).read_text())
        if isinstance(s, dict) and "audit_rows" not in s:
            stem = Path(f).name.removesuffix(".summary.json")
            sums[stem] = s
            rf = summary_table.rows_path(f)
            if rf.is_file():
                rows[stem] = summary_table.read_rows(rf)
    idx = path / "summary.json"
    index = json.loads(idx.read_text()) if idx.is_file() else {}
    return Report(label or report_label(path), path, sums, index if isinstance(index, dict) else {}, rows)


def load_options(
    pattern: str | None = OPTIONS_GLOB, introspect_installed: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """vLLM introspections, one per version: the installed vLLM's (live, first) and the JSON files matching
    ``pattern`` (relative to the repository). Returns ``(infos, notes)``; each info gets ``source``."""
    infos, notes = [], []
    if introspect_installed:
        try:
            from fp8lab.vllm_options import cached_inspect_vllm

            infos.append({**cached_inspect_vllm(), "source": "installed"})
        except Exception as e:  # noqa: BLE001 - no vLLM here is a finding, not an error
            notes.append(f"installed vLLM not introspected: {type(e).__name__}: {e}")
    if pattern:
        files = sorted(glob.glob(str(resolve(pattern))))
        if not files:
            notes.append(f"no vLLM options file matches {pattern}")
        for f in files:
            info = json.loads(Path(f).read_text())
            if any(i.get("version") == info.get("version") for i in infos):
                notes.append(f"{f}: vLLM {info.get('version')} already inspected, skipped")
                continue
            infos.append({**info, "source": f})
    return infos, notes


def default_configs() -> tuple[kvmath.KVLayout, ...]:
    """Every published config under ``data/configs``."""
    return tuple(kvmath.load_layout(p) for p in sorted(CONFIGS_DIR.iterdir()) if (p / "config.json").is_file())


def load_evidence(
    report_dir: str | Path,
    other_reports: Iterable[str | Path] = (),
    options_files: str | None = OPTIONS_GLOB,
    introspect_installed: bool = True,
    configs: Sequence[kvmath.KVLayout] | None = None,
    extra_summaries: Mapping[str, Sequence[str | Path]] | None = None,
) -> Evidence:
    """The evidence of the report in ``report_dir`` (its links are relative to it) and of ``other_reports``
    (each labelled by :func:`report_label`; missing folders are noted, not fatal). ``extra_summaries``
    ``{report label: [summary files]}`` adds summaries rendered elsewhere to that report (a missing file is
    noted)."""
    extra = {k: [p for p in v if resolve(p).is_file()] for k, v in (extra_summaries or {}).items()}
    missing = [str(p) for v in (extra_summaries or {}).values() for p in v if not resolve(p).is_file()]
    base = resolve(report_dir)
    reports, notes, seen = [], [], set()
    for p in [base, *map(resolve, other_reports)]:
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        if not p.is_dir():
            notes.append(f"report folder {p} not found")
            continue
        rep = load_report(p, extra=extra.get(report_label(p), ()))
        if not rep.summaries and p != base:
            notes.append(f"{p}: no study summaries ({SUMMARY_GLOB}), left out")
            continue
        if not rep.summaries:
            notes.append(f"{p}: no study summaries ({SUMMARY_GLOB})")
        labels = {r.label for r in reports}
        if rep.label in labels:
            rep = dataclasses.replace(rep, label=f"{p.parent.name}/{p.name}")
        reports.append(rep)
    notes += [f"extra summary {m} not found" for m in missing]
    infos, onotes = load_options(options_files, introspect_installed)
    return Evidence(
        tuple(reports),
        tuple(infos),
        tuple(configs) if configs is not None else default_configs(),
        None,
        base,
        tuple(notes + onotes),
    )
