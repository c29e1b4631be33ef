"""The studies, registered in one place: each line names a study's module (its package's ``study.py``, on the
contract of :mod:`fp8lab.study`), in the order the index shows them. Nothing else in fp8lab names a study: a study's
number, notebook stem (``NAME``), key numbers for the index (``key_numbers``) and what it cannot measure without the
native FP8 kernel (``NATIVE_ONLY``) are its own, and the report wing asks this registry for them.

Adding a study: its subpackage, its notebook, its profile entries (``fp8lab/profiles.yaml``), and one line here.

Standard library only: the modules are imported when first asked for (:func:`all_studies`), so reading the registry
loads no study, no pandas and no vLLM.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from fp8lab.study import check

#: The registered studies' modules, in the index's order.
MODULES: tuple[str, ...] = (
    "fp8lab.capacity.study",
    "fp8lab.serving.study",
    "fp8lab.calibration.study",
    "fp8lab.quality.study",
    "fp8lab.longctx.study",
    "fp8lab.audit.study",
    "fp8lab.decode.study",
    "fp8lab.prefix.study",
    "fp8lab.dtypes.study",
)


@functools.cache
def all_studies() -> dict[str, Any]:
    """Every registered study, by its notebook stem (``NAME``), imported and checked (:func:`fp8lab.study.check`)."""
    out: dict[str, Any] = {}
    for module in MODULES:
        study = check(importlib.import_module(module))
        out[study.NAME] = study
    return out


def names() -> list[str]:
    """The registered studies' notebook stems, in the index's order."""
    return list(all_studies())


def load(name: str) -> Any:
    """The registered study whose notebook stem is ``name``."""
    studies = all_studies()
    if name not in studies:
        raise KeyError(f"study {name!r}: registered are {' | '.join(studies)}")
    return studies[name]


def of_package(package: str) -> Any:
    """The registered study of the subpackage ``package`` (``"decode"``: :mod:`fp8lab.decode.study`)."""
    module = f"fp8lab.{package}.study"
    if module not in MODULES:
        raise KeyError(f"study package {package!r}: registered are {' | '.join(m.split('.')[1] for m in MODULES)}")
    return check(importlib.import_module(module))


def number(stem: str) -> str:
    """A page's study number, the part of its stem before the first ``_`` (``07_prefix_cache`` -> ``07``)."""
    return stem.split("_", 1)[0]


def for_page(stem: str) -> Any | None:
    """The registered study a report page ``stem`` belongs to: the one named ``stem``, else the one with the same
    study number (a page written under another name by a profile); None for a page no registered study makes."""
    studies = all_studies()
    if stem in studies:
        return studies[stem]
    same = [s for name, s in studies.items() if number(name) == number(stem)]
    return same[0] if len(same) == 1 else None
