"""Time the front door on a fresh clone and write the figures into the README's table.

    python3 scripts/bench_front_door.py [setup] [main] [suite] [full] [--keep DIR]

``setup``: ``bash scripts/setup_cpu.sh`` in a fresh ``git clone`` of this checkout's HEAD (no ``.venv`` yet);
``main``: the main job after setup, ``bash scripts/report_cpu.sh`` (profile cpu-quick); ``suite``: the README's
test command after setup, ``bash scripts/test.sh`` (what CI runs); ``full``: the fuller CPU run,
``bash scripts/report_cpu.sh out/cpu-tiny cpu-tiny``. With no part named, all four, in that order
(the others run setup first when it was not asked for, untimed); parts run in the order given. Each part's wall time, exit status,
the date, the commit and the machine (cores, memory, CPU model, and whether it has the CPU FP8 KV kernel's
AVX-512/AMX) go to ``reports/bench/front_door.jsonl`` (one line per part, appended) and into the
README's table between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` (the latest line per part with and
without the FP8 KV kernel). The clone
is removed unless ``--keep``. No figure is typed by hand: the table is rewritten from the JSON lines only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "reports" / "bench" / "front_door.jsonl"
README = ROOT / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
PARTS = {
    "setup": ("set up (`bash scripts/setup_cpu.sh`, fresh clone, no `.venv`)", ["bash", "scripts/setup_cpu.sh"]),
    "main": (
        "main job after setup (`bash scripts/report_cpu.sh`, profile cpu-quick)",
        ["bash", "scripts/report_cpu.sh", "out/cpu-quick", "cpu-quick"],
    ),
    "suite": ("test suite after setup (`bash scripts/test.sh`, what CI runs)", ["bash", "scripts/test.sh"]),
    "full": (
        "fuller CPU run after setup (`bash scripts/report_cpu.sh out/cpu-tiny cpu-tiny`)",
        ["bash", "scripts/report_cpu.sh", "out/cpu-tiny", "cpu-tiny"],
    ),
}
TARGETS_MIN = {"main": 10.0, "suite": 15.0}  # issue 19's targets on 2 cores


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and FP8 KV tier of this machine (what the figures depend on)."""
    sys.path.insert(0, str(ROOT))  # fp8lab.engine.capability is stdlib-only: the rule the studies use, not a copy
    from fp8lab.engine.capability import isa_from_flags, parse_cpu_flags

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    cpu = next(
        (x.split(":", 1)[1].strip() for x in cpuinfo.splitlines() if x.startswith("model name")),
        platform.processor() or "",
    )
    avx512, amx = isa_from_flags(parse_cpu_flags(cpuinfo))
    tier = "AMX" if amx else "AVX-512" if avx512 else "no AVX-512/AMX: no FP8 KV kernel"
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cores": os.cpu_count(), "mem_gib": mem_gib, "cpu": cpu, "fp8_tier": tier}


def run_part(name: str, clone: Path, log_dir: Path) -> dict[str, Any]:
    _, cmd = PARTS[name]
    log = log_dir / f"{name}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, cwd=clone, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    tail = log.read_text(errors="replace").splitlines()[-3:]
    return {"part": name, "wall_s": round(wall, 1), "rc": rc, "last_lines": tail}


def table(lines: list[dict[str, Any]]) -> str:
    """The README table from the records: the latest line per part on a machine with the CPU FP8 KV kernel (AMX or
    AVX-512) and on one without it (the suite runs the native-FP8 tests only where the kernel exists, and the studies
    run reduced or emulated where it does not, so a figure from one says nothing of the other); each in the order
    first measured. The machine column names the tier."""
    latest: dict[tuple[str, bool], dict[str, Any]] = {}
    for r in lines:
        latest[(r["part"], "no FP8 KV kernel" in r["machine"]["fp8_tier"])] = r
    rows = ["| what | measured | target | exit | when, commit | machine |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (label, _) in PARTS.items():
        target = f"<= {TARGETS_MIN[name]:.0f} min" if name in TARGETS_MIN else ""
        found = [r for (part, _), r in latest.items() if part == name]
        if not found:
            rows.append(f"| {label} | not measured yet | {target} | | | |")
        for r in found:
            m = r["machine"]
            rows.append(
                f"| {label} | {r['wall_s'] / 60:.1f} min | {target} | {r['rc']} | {r['date_utc'][:10]}, "
                f"`{r['commit']}` | {m['cores']} cores, {m['mem_gib']} GiB, {m['cpu']} ({m['fp8_tier']}) |"
            )
    return "\n".join(rows)


def write_readme(lines: list[dict[str, Any]], readme: Path = README) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} block for the table")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table(lines)}\n{END}{tail}")


def read_records(path: Path = RECORDS) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", help="what to time: " + " | ".join(PARTS) + " (default: all)")
    ap.add_argument("--keep", help="clone into this folder and keep it")
    a = ap.parse_args(argv)
    bad = [p for p in a.parts if p not in PARTS]
    if bad:
        ap.error(f"parts = {bad}: each one of " + " | ".join(PARTS))
    parts = a.parts or list(PARTS)
    commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="fp8lab-bench-"))
    clone = base / "fp8lab"
    subprocess.check_call(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)])
    log_dir = base / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    mach = machine()
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    rc_all = 0
    try:
        if "setup" not in parts:
            subprocess.check_call(["bash", "scripts/setup_cpu.sh"], cwd=clone, stdout=subprocess.DEVNULL)
        for p in dict.fromkeys(parts):  # in the order given
            r = {
                **run_part(p, clone, log_dir),
                "commit": commit,
                "machine": mach,
                "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "python": sys.version.split()[0],
            }
            rc_all = rc_all or r["rc"]
            with open(RECORDS, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{p}: {r['wall_s'] / 60:.1f} min, exit {r['rc']} (log {log_dir / (p + '.log')})", flush=True)
        write_readme(read_records())
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    return rc_all


if __name__ == "__main__":
    raise SystemExit(main())
