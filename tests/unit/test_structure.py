"""The package's structure, as CI checks it: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml:
layers cli > report > studies > audit > engine > foundation, no cycle between siblings), no private name borrowed
across modules, and no study named by its number outside its own package (docs/architecture.md).

Each check is shown failing on a planted violation, so a check that cannot fail is not mistaken for a kept rule.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from fp8lab.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "fp8lab"


# ----------------------------------------------------------------------------------------------- import-linter
def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` (installed with the test extra) on the package under ``root``, with ``root``'s
    pyproject.toml; ``PYTHONPATH`` points at ``root`` so the package analysed is that one."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = (
        [str(exe)]
        if exe.exists()
        else [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([*cmd, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_lint_imports_keeps_every_contract():
    res = _lint_imports(REPO_ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"Contracts: (\d+) kept, 0 broken", res.stdout), res.stdout
    assert int(re.search(r"Contracts: (\d+) kept", res.stdout).group(1)) >= 2


def test_lint_imports_fails_on_an_arrow_up_and_on_a_cycle_hidden_in_a_function(tmp_path):
    """A copy of the package with two planted imports, each inside a function (grimp reads those too): the engine
    importing the report wing (an arrow up), and a study's spec importing its own runner (a cycle between siblings)."""
    shutil.copytree(PACKAGE, tmp_path / "fp8lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "fp8lab" / "engine" / "devices.py", "a") as f:
        f.write("\n\ndef _planted():\n    from fp8lab.report import index  # noqa: F401\n")
    with open(tmp_path / "fp8lab" / "decode" / "spec.py", "a") as f:
        f.write("\n\ndef _planted():\n    from fp8lab.decode import run  # noqa: F401\n")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    assert "fp8lab.engine is not allowed to import fp8lab.report" in res.stdout, res.stdout
    assert "No cycles are allowed in fp8lab.decode" in res.stdout, res.stdout


# ------------------------------------------------------------------------------------------------ private names
def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def borrowed_private_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, name)`` of every private name (one leading underscore) of another fp8lab module that ``source``
    (the text of ``module``) imports (``from fp8lab.x import _y``) or reaches through an imported module
    (``x._y``)."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    bound: dict[str, str] = {}  # local name -> the fp8lab module or object it is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "fp8lab" and not target.startswith("fp8lab."):
                continue
            for alias in node.names:
                if _private(alias.name) and target != module:
                    found.append((node.lineno, f"{target}.{alias.name}"))
                bound[alias.asname or alias.name] = f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "fp8lab" or alias.name.startswith("fp8lab."):
                    bound[alias.asname or "fp8lab"] = alias.name if alias.asname else "fp8lab"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                owner = ".".join([bound[value.id], *reversed(chain)])
                if owner != module:
                    found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(found)


def test_no_private_name_is_borrowed_across_modules():
    found = [
        f"{p.relative_to(REPO_ROOT)}:{line}: {name}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for line, name in borrowed_private_names(p.read_text(), module_name(p), p.name == "__init__.py")
    ]
    assert found == [], (
        "private names used outside their module (make them public or keep them at home):\n" + "\n".join(found)
    )


def test_the_private_name_check_finds_a_planted_borrowing():
    planted = (
        "from fp8lab.engine.procs import kill_group, _attach_shared\n"
        "from fp8lab.engine import devices\n"
        "from . import _helpers\n"
        "import fp8lab.engine.worker as w\n"
        "def f():\n"
        "    devices._version('vllm')\n"
        "    w.__name__\n"
        "    _local = 1\n"
    )
    assert borrowed_private_names(planted, "fp8lab.decode.run") == [
        (1, "fp8lab.engine.procs._attach_shared"),
        (3, "fp8lab.decode._helpers"),
        (6, "fp8lab.engine.devices._version"),
    ]
    # a module's own private names are its own
    assert borrowed_private_names("from fp8lab.decode.run import _x\n", "fp8lab.decode.run") == []


# ------------------------------------------------------------------------------------------------ study numbers
#: Which package owns which study number: the one place outside the studies where the numbers are written (each
#: study's own package writes its own; the registry fp8lab.studies names the packages, not the numbers).
OWNER = {
    "00": "capacity",
    "01": "serving",
    "02": "calibration",
    "03": "quality",
    "04": "longctx",
    "05": "audit",
    "06": "decode",
    "07": "prefix",
    "08": "dtypes",
}
#: A string that names a study by its number: ``"06"``, ``"06_"``, ``"06_decode_speed"``, or a path part
#: ``.../06_decode_speed.html``.
_STUDY_ID = re.compile(r"(?:^|/)(0[0-8])(?:_[a-z][a-z0-9_.]*)?$|^(0[0-8])_$|(?:^|/)(0[0-8])_[a-z][\w.]*")


def study_numbers(source: str, path: str) -> list[tuple[int, str]]:
    """``(line, literal)`` of every string in ``source`` (the file ``path`` relative to the repository, e.g.
    ``fp8lab/report/index.py``) that names a study by number, other than its own package's study; docstrings and
    comments are prose and not counted."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    parts = Path(path).parts
    home = parts[1] if len(parts) > 2 else None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            m = _STUDY_ID.search(node.value)
            if m and OWNER[next(g for g in m.groups() if g)] != home:
                found.append((node.lineno, node.value))
    return sorted(found)


def test_no_study_is_named_by_number_outside_its_own_package():
    """The claims audit too: it names the studies it reads by their pages' names (fp8lab/audit/pages.py) and shows
    the number the page it found carries."""
    found = [
        f"{p.relative_to(REPO_ROOT).as_posix()}:{line}: {text!r}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for line, text in study_numbers(p.read_text(), p.relative_to(REPO_ROOT).as_posix())
    ]
    assert found == [], "a study named by its number outside its package (ask fp8lab.studies instead):\n" + "\n".join(
        found
    )


def test_the_study_number_check_finds_a_planted_number():
    planted = (
        '"""Docstrings may say Study 06 (06_decode_speed) in prose."""\n'
        'if stem.startswith("06_"):\n'
        '    page = "reports/h200/07_prefix_cache.html"\n'
        'NATIVE_ONLY = {"01": "throughput"}\n'
        'x = "0.06"\n'
        'y = "2026-12-03_08"\n'
    )
    assert study_numbers(planted, "fp8lab/report/index.py") == [
        (2, "06_"),
        (3, "reports/h200/07_prefix_cache.html"),
        (4, "01"),
    ]
    # a study's own package writes its own number, not another's
    assert study_numbers('STUDY = "06_decode"\nOTHER = "07_prefix_cache"\n', "fp8lab/decode/spec.py") == [
        (2, "07_prefix_cache")
    ]
