"""Profiles: named parameter sets for the notebooks (``fp8lab/profiles.yaml``: a profile's ``params`` for every
notebook, ``notebooks`` per notebook, ``extends`` another profile), and a notebook's parameters resolved from its
``parameters`` cell, a profile and overrides, each checked against the cell's own value (:func:`parameters_for`,
:func:`check_overrides`) before any notebook starts. Split out of :mod:`fp8lab.report.run` (issue 16), which re-exports
every name here (``report.load_profile``, ``report.TEST_PROFILE``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp8lab.errors import SpecError
from fp8lab.paths import NOTEBOOKS_DIR

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
#: The test suite's notebook tier runs on this profile (cpu-tiny with fewer repetitions; profiles.yaml says why).
TEST_PROFILE = "cpu-ci"
#: ... and on this one where the native FP8 KV kernel is missing and FP8 runs emulated (profiles.yaml says why).
EMULATED_TEST_PROFILE = "cpu-ci-emulated"


def tier_profile(native_fp8: bool) -> str:
    """The test tier's profile on a device with (``native_fp8``) or without the native FP8 KV kernel
    (:func:`fp8lab.engine.capability.kv_support`)."""
    return TEST_PROFILE if native_fp8 else EMULATED_TEST_PROFILE


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, Any]:
    """The profiles file as ``{name: profile}``; a file that is not YAML, or whose entries are not mappings,
    raises :class:`SpecError` naming the file and the problem."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}: {getattr(exc, 'problem', '')})" if mark is not None else f" ({exc})"
        raise SpecError("Profile", "file", str(path), "a UTF-8 YAML mapping of profile names" + at) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SpecError(
            "Profile", "file", str(path), "a YAML mapping of profile name -> {description, params, notebooks}"
        )
    for name, prof in data.items():
        for key in ("params", "notebooks"):
            if prof.get(key) is not None and not isinstance(prof[key], dict):
                raise SpecError("Profile", f"{name}.{key}", prof[key], "a mapping of NAME: value")
        run = prof.get("run")  # the notebooks `fp8lab run --profile NAME` runs when none are named
        if run is not None and (not isinstance(run, list) or not all(isinstance(x, str) for x in run)):
            raise SpecError("Profile", f"{name}.run", run, "a list of notebook names or prefixes, e.g. ['00', '06']")
    return {name: _extended(name, data) for name in data}


def _extended(name: str, data: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Profile ``name`` with its ``extends: BASE`` resolved: the base's ``params`` and each of its notebook entries,
    updated by this profile's own (a notebook entry merges name by name; a value here replaces the base's)."""
    prof = data[name]
    base_name = prof.get("extends")
    if base_name is None:
        return prof
    if base_name not in data or base_name == name:
        raise SpecError(
            "Profile",
            f"{name}.extends",
            base_name,
            "the name of another profile: " + " | ".join(n for n in data if n != name),
        )
    if base_name in seen:
        raise SpecError(
            "Profile",
            f"{name}.extends",
            base_name,
            "a chain without a cycle (" + " -> ".join((*seen, name, base_name)) + ")",
        )
    base = _extended(base_name, data, (*seen, name))
    notebooks = {k: dict(v or {}) for k, v in (base.get("notebooks") or {}).items()}
    for nb, over in (prof.get("notebooks") or {}).items():
        notebooks[nb] = {**notebooks.get(nb, {}), **(over or {})}
    return {
        **base,
        **prof,
        "params": {**(base.get("params") or {}), **(prof.get("params") or {})},
        "notebooks": notebooks,
        "extends": base_name,
    }


def load_profile(name: str, path: Path = PROFILES_FILE) -> dict[str, Any]:
    profiles = load_profiles(path)
    if name not in profiles:
        raise SpecError("Profile", "name", name, "one of " + " | ".join(profiles))
    return profiles[name]


def list_notebooks(names: Sequence[str] | None = None, nb_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Notebooks to run: all ``NN_*.ipynb`` in order, the claims audit last (it reads the others' summaries),
    or the named ones (by stem, file name or path)."""
    available = sorted(nb_dir.glob("[0-9][0-9]_*.ipynb"), key=lambda p: (p.stem.endswith("claims_audit"), p.name))
    if not names:
        return available
    out = []
    for n in names:
        p = Path(n)
        if p.is_file():
            out.append(p.resolve())
            continue
        hits = [a for a in available if a.stem == p.stem or a.stem.startswith(p.stem)]
        if len(hits) != 1:
            raise SpecError(
                "RunSpec",
                "notebooks",
                n,
                "a notebook path or the (prefix of a) name of one of: " + ", ".join(a.stem for a in available),
            )
        out.append(hits[0])
    return out


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "True or False"
    if isinstance(value, (int, float)):
        return "a number" if isinstance(value, float) else "an integer"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a string" if isinstance(value, str) else type(value).__name__


def check_parameter_type(where: str, name: str, value: Any, default: Any) -> None:
    """A notebook parameter's value must have the kind of the ``parameters`` cell's own default (an integer where
    it has an integer, a list where it has a list, ...; a float default takes an integer too; None, or a None
    default, takes anything): else :class:`SpecError` names it, before any kernel starts. A string where a
    list belongs (``-p KV_DTYPES fp8``) would otherwise be read letter by letter."""
    if value is None or default is None:
        return
    want, got = _kind(default), _kind(value)
    if want == got or (want == "a number" and got == "an integer"):
        return
    raise SpecError(where, name, value, f"{want} like the notebook's default {default!r} (or null)")


def _defaults(notebook: Path) -> dict[str, Any]:
    import ast

    import papermill

    out = {}
    for k, v in papermill.inspect_notebook(str(notebook)).items():
        try:
            out[k] = ast.literal_eval(v["default"])
        except (ValueError, SyntaxError):
            out[k] = None  # not a literal: no type to check against
    return out


def parameters_for(notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile's parameters that this notebook declares (papermill would warn on the others). The shared
    ``params`` and ``overrides`` may name parameters of other notebooks; the notebook's own entry may not: a name
    there that the notebook does not declare (a typo) raises :class:`SpecError` naming it."""
    import papermill

    declared = set(papermill.inspect_notebook(str(notebook)))
    own = (profile.get("notebooks") or {}).get(notebook.stem, {}) or {}
    for k, v in own.items():
        if k not in declared:
            raise SpecError(
                "Profile",
                f"notebooks.{notebook.stem}.{k}",
                v,
                "not a parameter of that notebook; allowed: " + " | ".join(sorted(declared)),
            )
    merged = dict(profile.get("params", {}))
    merged.update(own)
    merged.update(overrides or {})
    defaults = _defaults(notebook)
    for k, v in merged.items():
        if k in declared:
            where = "RunSpec" if k in (overrides or {}) else f"Profile.{notebook.stem}"
            check_parameter_type(where, k, v, defaults.get(k))
    return {k: v for k, v in merged.items() if k in declared}


def check_overrides(notebooks: Sequence[Path], overrides: dict[str, Any] | None) -> None:
    """Each ``-p NAME`` override must be a parameter of at least one of the notebooks to run; else (a typo,
    silently dropped otherwise) :class:`SpecError` names it, before any notebook starts."""
    import papermill

    if not overrides:
        return
    declared = set().union(*(papermill.inspect_notebook(str(nb)) for nb in notebooks))
    for k, v in overrides.items():
        if k not in declared:
            raise SpecError(
                "RunSpec",
                k,
                v,
                f"not a parameter of {', '.join(nb.stem for nb in notebooks)}; allowed: "
                + " | ".join(sorted(declared)),
            )
    for nb in notebooks:  # wrong kinds of value, before any notebook starts
        defaults = _defaults(nb)
        for k, v in overrides.items():
            if k in defaults:
                check_parameter_type("RunSpec", k, v, defaults[k])


def resolved_parameters(
    notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every parameter of the notebook as papermill runs it: the ``parameters`` cell's own values, then the
    profile's (:func:`parameters_for`), then ``overrides`` (for code that builds the notebook's specs itself)."""
    import ast

    import papermill

    params = {k: ast.literal_eval(v["default"]) for k, v in papermill.inspect_notebook(str(notebook)).items()}
    params.update(parameters_for(notebook, profile, overrides))
    return params
