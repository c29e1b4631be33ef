"""Re-key the committed H200 stores once: every stored run, capture, scale set and fidelity folder moves from the key
the H200 host wrote (the model as an absolute path in its checkout, ``/work/main/...``, and its store,
``/tmp/fp8lab-runs/...``) to the key of what was measured (:func:`fp8lab.engine.results.run_descriptor`: the model as
given, a digest of its config and weights, the study's own worker), and is proved to load under it.

How: each store is unpacked and each study that reads it is run on it in this process under ``FP8LAB_STORE_ONLY``
(the H200 profile's parameters, as the committed pages were rendered). Every content hash the study asks for
(:func:`fp8lab.specs.spec_hash`) is also computed in the old form (:func:`legacy`: the same data with the H200 host's
absolute paths and without the new fields); a stored folder named by the old hash (a capture, a scale set, a fidelity
check), or a stored run whose ``spec.json`` equals the old descriptor in everything but the versions, is moved to
the new name at once, its ``spec.json`` rewritten (the versions it was measured with kept), before the study looks it
up. So the study itself finds the chain of keys (capture -> scale set -> the engine run of that scale set's folder).
Then the store is packed again (``scripts/slim_store.pack``: sorted, fixed times), unpacked into a fresh folder and
every study run on it once more with nothing moved: every key it asks for must name a stored folder (``missing``
lists any that does not) and its summary must equal the first pass's.

    PYTHONPATH=. python scripts/rekey_stores.py [--write] [--only NAME ...]
    PYTHONPATH=. python scripts/rekey_stores.py --check [--only NAME ...]

Without ``--write`` the tarballs are left as they are (a dry run: the report is printed either way). ``--check``
proves the committed tarballs as they are: every key the studies ask for names a stored folder, and each study's
summary and rows, written as its notebook writes them, are compared byte for byte with the committed page's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from slim_store import pack  # noqa: E402

from fp8lab import specs  # noqa: E402
from fp8lab.engine import results  # noqa: E402
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT  # noqa: E402

#: Where the H200 host's checkout and store were: the absolute paths the old keys hold.
LEGACY_REPO = "/work/main"
LEGACY_RUNS = "/tmp/fp8lab-runs"
H200 = REPO / "reports" / "h200"
#: name -> (tarballs unpacked into one store, profile, [(notebook stem, parameter overrides)]), as the pages were
#: rendered (README, reports/h200/README.md).
STORES: dict[str, tuple[list[Path], str, list[tuple[str, dict[str, Any]]]]] = {
    "01": (
        [H200 / "records/01_kv_dtype_auto_vs_fp8.tar.gz"],
        "h200",
        [("01_kv_dtype_auto_vs_fp8", {"BANDWIDTH_GBS": 4069.9173720405943, "RUN_FIDELITY": True})],
    ),
    "02_03": (
        [H200 / "records/03_quality.tar.gz", H200 / "records/02_calibration.tar.gz"],
        "h200",
        [("03_quality_token_match", {}), ("02_calibration_32_tokens", {})],
    ),
    "04": ([H200 / "records/04_long_context.tar.gz"], "h200", [("04_long_context_ramp_128k", {})]),
    # 06_decode.tar.gz is left as it is: it holds no absolute path (a decode spec names its model as given) and the
    # H200 profile finds its run by content (RECORDS, fp8lab.decode.run.find_run: placement and newer fields aside)
    "07": ([H200 / "records/07_prefix_cache.tar.gz"], "h200", [("07_prefix_cache", {})]),
    "shipped_01": (
        [H200 / "shipped/records/01_kv_dtype_auto_vs_fp8.tar.gz"],
        "h200-shipped",
        [
            (
                "01_kv_dtype_auto_vs_fp8",
                {"BANDWIDTH_GBS": 4101.256613137273, "RUN_FIDELITY": True, "FIDELITY_ROUNDS": 1},
            )
        ],
    ),
    "shipped_07": ([H200 / "shipped/records/07_prefix_cache.tar.gz"], "h200-shipped", [("07_prefix_cache", {})]),
}

ENGINE_FIELDS = {"model", "kv_cache_dtype", "load_format", "gpu_memory_utilization", "enforce_eager"}
NEW_FIELDS = ("model_digest", "study_code")
_orig_hash = specs.spec_hash


class Rekey:
    """The spec_hash wrapper of one pass: ``move`` (first pass) moves old-keyed folders to their new names."""

    def __init__(self, store: Path, move: bool) -> None:
        self.store, self.move = store, move
        self.new_to_old: dict[str, str] = {}
        self.moved: list[tuple[str, str]] = []
        self.asked: list[tuple[str, Any]] = []

    # -- the old form of a key's data ------------------------------------------------------------------------------
    def legacy_path(self, ref: str) -> str:
        if ref.startswith(results.RUNS_PREFIX):
            parts = ref[len(results.RUNS_PREFIX) :].split("/")
            return "/".join([LEGACY_RUNS, *(self.new_to_old.get(p, p) for p in parts)])
        if (REPO_ROOT / ref).exists() and not Path(ref).is_absolute():
            return f"{LEGACY_REPO}/{ref}"
        return ref

    def legacy(self, obj: Any, key: str | None = None) -> Any:
        if isinstance(obj, dict):
            if set(obj) == {"model", "digest"}:  # results.model_id: the old keys held the absolute path
                return self.legacy_path(obj["model"])
            d = {k: self.legacy(v, k) for k, v in obj.items() if k not in NEW_FIELDS}
            if ENGINE_FIELDS <= set(d) and isinstance(d["model"], str) and key != "spec":
                d["model"] = self.legacy_path(d["model"])  # an EngineSpec's dict (a decode/prefix "spec": as given)
            return d
        if isinstance(obj, (list, tuple)):
            return [self.legacy(v) for v in obj]
        if isinstance(obj, str):
            return self.new_to_old.get(obj, obj)
        return obj

    # -- the wrapper -----------------------------------------------------------------------------------------------
    def spec_hash(self, *parts: Any, n: int = 12) -> str:
        new = _orig_hash(*parts, n=n)
        old = _orig_hash(*self.legacy(list(parts)), n=n)
        if old != new:
            self.new_to_old[new] = old
        self.asked.append((new, parts))
        if self.move:
            self._move(new, old, parts)
        return new

    def _move(self, new: str, old: str, parts: tuple) -> None:
        desc = parts[0] if len(parts) == 1 and isinstance(parts[0], dict) else None
        if desc is not None and any(k in desc for k in results.VERSION_KEYS):
            self._move_run(desc)
            return
        for p in sorted(self.store.rglob(f"{old}*")):
            if p.name not in (old, f"{old}.npz") or any(q.startswith(".") for q in p.relative_to(self.store).parts):
                continue
            dest = p.with_name(p.name.replace(old, new))
            if dest.exists():
                continue
            os.replace(p, dest)
            self.moved.append((str(p.relative_to(self.store)), dest.name))
            if desc is not None and (dest / "settings.json").is_file():  # a fidelity check's folder
                (dest / "settings.json").write_text(json.dumps(desc, indent=2, sort_keys=True, default=str))

    def _move_run(self, desc: dict[str, Any]) -> None:
        skip = (*results.VERSION_KEYS, *NEW_FIELDS)
        want = json.dumps({k: v for k, v in self.legacy(desc).items() if k not in skip}, sort_keys=True, default=str)
        for f in sorted(self.store.glob("[!.]*/[!.]*/spec.json")):
            stored = json.loads(f.read_text())
            if json.dumps({k: v for k, v in stored.items() if k not in skip}, sort_keys=True, default=str) != want:
                continue
            new_desc = {
                k: v for k, v in json.loads(json.dumps(desc, default=str)).items() if k not in results.VERSION_KEYS
            }
            new_desc.update({k: stored[k] for k in results.VERSION_KEYS if k in stored})  # what it was measured with
            dest = f.parent.with_name(_orig_hash(new_desc))
            if dest.exists():
                continue
            f.write_text(json.dumps(new_desc, indent=2, sort_keys=True))
            os.replace(f.parent, dest)
            self.moved.append((str(f.parent.relative_to(self.store)), dest.name))

    def missing(self) -> list[str]:
        """Run keys asked for that no stored folder answers (a run, decode or prefix descriptor)."""
        out = []
        for new, parts in self.asked:
            desc = parts[0] if len(parts) == 1 and isinstance(parts[0], dict) else None
            if desc is None or not any(k in desc for k in results.VERSION_KEYS):
                continue
            study = desc.get("study")
            rd = None
            for f in sorted(self.store.glob("[!.]*/[!.]*/spec.json")):
                if study is not None and f.parent.parent.name != study:
                    continue
                if results.stored_elsewhere(f.parent.parent / new, desc, done=lambda d: True) is not None:
                    rd = f
                    break
            if rd is None:
                out.append(f"{new} ({desc.get('study') or desc.get('engine', {}).get('kv_cache_dtype')})")
        return sorted(set(out))


def _patch(wrapper: Rekey) -> list[tuple[Any, str, Any]]:
    saved = []
    for name, mod in list(sys.modules.items()):  # fp8lab's own modules only (others load lazily on getattr)
        if name.startswith("fp8lab") and mod is not None and vars(mod).get("spec_hash") is _orig_hash:
            saved.append((mod, "spec_hash", _orig_hash))
            mod.spec_hash = wrapper.spec_hash
    return saved


def run_studies(
    store: Path, profile: str, studies: list[tuple[str, dict[str, Any]]], wrapper: Rekey, out_dir: Path | None = None
) -> dict:
    """Each study on ``store`` under FP8LAB_STORE_ONLY, in this process: ``{stem: summary}``; with ``out_dir``, its
    ``<stem>.summary.json`` and ``.rows.json`` written there as the notebook writes them (``report.record_summary``)."""
    from fp8lab import studies as registry
    from fp8lab.profiles import load_profile, resolved_parameters
    from fp8lab.report import run as report

    os.environ[results.STORE_ONLY_ENV] = "1"
    os.environ["FP8LAB_RUNS"] = str(store)
    out = {}
    for stem, extra in studies:
        mod = registry.load(stem)  # imported before patching, so its own `spec_hash` names are patched too
        saved = _patch(wrapper)
        try:
            spec = mod.Spec.from_params(
                resolved_parameters(NOTEBOOKS_DIR / f"{stem}.ipynb", load_profile(profile), extra)
            )
            res = mod.run(spec, store=store)
            summary = res.summary()
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                report.record_summary(summary, out_dir / f"{stem}.summary.json", rows=res.rows())
            out[stem] = json.loads(json.dumps(summary, sort_keys=True, default=str))
            out[stem].pop("study_wall_s", None)
        finally:
            for mod_, name, fn in saved:
                setattr(mod_, name, fn)
    return out


def unpack(tarballs: list[Path], into: Path) -> None:
    into.mkdir(parents=True)
    for t in tarballs:
        with tarfile.open(t) as tf:
            tf.extractall(into, filter="tar")


def _members(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tf:
        return [str(Path(m.name)) for m in tf if str(Path(m.name)) != "."]


def _renamed(member: str, moved: list[tuple[str, str]]) -> str:
    for old, new in moved:
        dest = str(Path(old).with_name(new))
        if member == old or member.startswith(old + "/"):
            member = dest + member[len(old) :]
    return member


def rekey(name: str, work: Path, write: bool) -> bool:
    """Re-key one store (its tarballs unpacked together), pack each tarball again with its own members under their
    new names, and check the packed store (see the module's doc). Replaces the tarballs when ``write`` and all is
    well."""
    tarballs, profile, studies = STORES[name]
    a = work / name / "a"
    unpack(tarballs, a)
    first = Rekey(a, move=True)
    summary_a = run_studies(a, profile, studies, first)
    print(f"[{name}] moved {len(first.moved)}: " + ", ".join(f"{o} -> {n}" for o, n in first.moved), flush=True)
    packed = []
    for t in tarballs:  # each tarball keeps its own members (02's and 03's share the 03_quality folder)
        part = work / name / f"pack-{t.name}"
        part.mkdir()
        for m in _members(t):
            src, dest = a / _renamed(m, first.moved), part / _renamed(m, first.moved)
            if src.is_symlink() or src.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest, follow_symlinks=False)
            else:
                dest.mkdir(parents=True, exist_ok=True)
        out = work / name / t.name
        pack(part, out)
        packed.append((t, out))
    b = work / name / "b"
    unpack([o for _, o in packed], b)
    second = Rekey(b, move=False)
    summary_b = run_studies(b, profile, studies, second)
    missing = second.missing()
    same = summary_a == summary_b
    print(
        f"[{name}] second pass on the re-packed store: {len(second.asked)} keys asked, missing {missing}, "
        f"summaries equal to the first pass's: {same}",
        flush=True,
    )
    for t, o in packed:
        print(f"[{name}] {t.relative_to(REPO)}: {t.stat().st_size} -> {o.stat().st_size} bytes", flush=True)
    for stem, summ in summary_b.items():
        (work / name / f"{stem}.summary.json").write_text(json.dumps(summ, indent=1, sort_keys=True))
    ok = not missing and same
    if write and ok:
        for t, o in packed:
            shutil.copy(o, t)
    return ok


def check(name: str, work: Path) -> bool:
    """The committed tarballs of ``name`` as they are: every run key its studies ask for names a stored folder, and
    each study's summary and rows, written as its notebook writes them, compared byte for byte with the committed
    page's files (``study_wall_s``, the re-render's own time, set aside)."""
    tarballs, profile, studies = STORES[name]
    store = work / name / "check"
    unpack(tarballs, store)
    w = Rekey(store, move=False)
    out = work / name / "check-out"
    with contextlib.redirect_stdout(io.StringIO()):  # record_summary prints the summary
        run_studies(store, profile, studies, w, out_dir=out)
    missing = w.missing()
    pages = tarballs[0].parent.parent
    print(f"[{name}] {len(w.asked)} keys asked, missing {missing}", flush=True)
    ok = not missing
    for f in sorted(out.iterdir()):
        ref = pages / f.name
        if not ref.exists():
            print(f"[{name}]   {f.name}: no committed file", flush=True)
            continue
        a, b = f.read_bytes(), ref.read_bytes()
        if f.name.endswith(".summary.json") and a != b:
            ja, jb = json.loads(a), json.loads(b)
            diff = sorted(k for k in set(ja) | set(jb) if ja.get(k) != jb.get(k))
            ok &= diff == ["study_wall_s"]
            print(f"[{name}]   {f.name}: differs in {diff[:12]}{' ...' if len(diff) > 12 else ''}", flush=True)
        else:
            ok &= a == b or f.suffix == ".parquet"
            print(f"[{name}]   {f.name}: {'byte-identical' if a == b else 'differs'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the committed tarballs")
    ap.add_argument("--check", action="store_true", help="only check the committed tarballs as they are")
    ap.add_argument("--only", nargs="*", default=list(STORES))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fp8lab-rekey-"))
    print(f"work folder: {work}", flush=True)
    results_ok = {n: check(n, work) if a.check else rekey(n, work, a.write) for n in a.only}
    print(json.dumps(results_ok))
    return 0 if all(results_ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
