"""Repository checks CI enforces: notebooks committed stripped with one parameters cell; ruff clean; mypy clean on
the bottom layers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib

import nbformat
import pytest

from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped_and_parameterized(path):
    nb = nbformat.read(str(path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit notebooks stripped"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    names = [
        ln.split("=")[0].strip() for ln in tagged[0].source.splitlines() if "=" in ln and not ln.startswith((" ", "#"))
    ]
    assert names and all(n.isupper() for n in names), names


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(REPO_ROOT / ".venv/bin/ruff")
    res = subprocess.run(
        [ruff, "check", "fp8lab", "tests", "notebooks", "scripts"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]


def test_ruff_formatted():
    """``ruff format --check``: the layout is ruff's, settings in pyproject.toml (notebooks excluded there)."""
    ruff = shutil.which("ruff") or str(REPO_ROOT / ".venv/bin/ruff")
    res = subprocess.run(
        [ruff, "format", "--check", "fp8lab", "tests", "scripts"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    assert "already formatted" in res.stdout, res.stdout


def test_mypy_clean():
    """mypy on the modules ``[tool.mypy] files`` in pyproject.toml lists (the bottom layers), with its settings there;
    the summary line shows it read that configuration and checked every one of them."""
    files = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert "fp8lab/kvmath.py" in files and all((REPO_ROOT / f).is_file() for f in files), files
    mypy = shutil.which("mypy") or str(REPO_ROOT / ".venv/bin/mypy")
    res = subprocess.run([mypy, "--python-executable", sys.executable], cwd=REPO_ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    assert f"no issues found in {len(files)} source files" in res.stdout, res.stdout


def test_package_imports_without_torch():
    code = (
        "import sys, fp8lab.cli, fp8lab.kvmath, fp8lab.specs; print(any(m in sys.modules for m in ('torch', 'vllm')))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


#: A device call carries the working tree and its staging parts in 64 MiB; the tracked tree may use half of it.
TRACKED_TREE_LIMIT = 32 * 2**20


def test_tracked_tree_leaves_room_for_a_device_call():
    """The sum of the sizes of every tracked file (``git ls-files``) stays at or under 32 MiB (issue 15): keep
    per-token arrays as the aggregates the notebooks read, HTML without code (fp8lab.report.htmlslim), stores
    compact (scripts/slim_store.py)."""
    git = shutil.which("git")
    if (
        git is None
        or subprocess.run(
            [git, "-C", str(REPO_ROOT), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True
        ).stdout.strip()
        != "true"
    ):
        pytest.skip("git is absent (no git executable or no git checkout): the tracked tree cannot be listed")
    names = subprocess.run([git, "-C", str(REPO_ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    sizes = {}
    for name in names.decode().split("\0"):
        p = REPO_ROOT / name
        if name and p.is_file() and not p.is_symlink():
            sizes[name] = p.stat().st_size
    total = sum(sizes.values())
    largest = ", ".join(f"{n} {s / 2**20:.1f} MiB" for n, s in sorted(sizes.items(), key=lambda x: -x[1])[:5])
    assert len(sizes) > 100 and total > 10 * 2**20  # it did list the repository (the shipped model alone is 13 MiB)
    assert total <= TRACKED_TREE_LIMIT, (
        f"tracked tree {total:,} bytes ({total / 2**20:.2f} MiB) > {TRACKED_TREE_LIMIT:,} (32 MiB); largest: {largest}"
    )
