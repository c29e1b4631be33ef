"""The front-door benchmark's table: written from its JSON records only, the latest line per part and FP8 tier."""

from __future__ import annotations

import importlib.util

import pytest

from fp8lab.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("bench_front_door", REPO_ROOT / "scripts" / "bench_front_door.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

MACH = {"cores": 2, "mem_gib": 23.4, "cpu": "AMD EPYC", "fp8_tier": "AVX2, no FP8 KV kernel"}


def _rec(part, wall_s, rc=0, date="2026-12-01T22:00:00+00:00", commit="abc1234"):
    return {"part": part, "wall_s": wall_s, "rc": rc, "date_utc": date, "commit": commit, "machine": MACH}


def test_table_takes_the_latest_record_per_part_and_marks_what_was_not_measured():
    t = bench.table([_rec("suite", 3000.0), _rec("setup", 240.0), _rec("suite", 1710.0, commit="def5678")])
    rows = t.splitlines()
    assert rows[0].startswith("| what | measured | target |")
    setup = next(r for r in rows if r.startswith("| set up"))
    assert "| 4.0 min |  | 0 | 2026-12-01, `abc1234` | 2 cores, 23.4 GiB, AMD EPYC (AVX2, no FP8 KV kernel) |" in setup
    suite = next(r for r in rows if r.startswith("| test suite"))
    assert "| 28.5 min | <= 15 min | 0 | 2026-12-01, `def5678` |" in suite  # the later line, not the first
    main = next(r for r in rows if r.startswith("| main job"))
    assert "| not measured yet | <= 10 min |" in main


def test_write_readme_replaces_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{bench.START}\nold table\n{bench.END}\nafter\n")
    bench.write_readme([_rec("main", 600.0, rc=1)], readme)
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{bench.END}\nafter\n")
    assert "old table" not in text and "| 10.0 min | <= 10 min | 1 |" in text
    readme.write_text("no markers")
    with pytest.raises(SystemExit, match="no <!-- bench:start -->"):
        bench.write_readme([], readme)


def test_an_unknown_part_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        bench.main(["setup", "everything"])
    assert "parts = ['everything']: each one of setup | main | suite | full" in capsys.readouterr().err


def test_the_readme_has_the_block():
    text = (REPO_ROOT / "README.md").read_text()
    assert text.count(bench.START) == 1 and text.count(bench.END) == 1


def test_with_and_without_the_fp8_kernel_each_keep_their_latest_line():
    """An AVX2 machine skips the native-FP8 tests: its suite time must not replace the AMX machine's figure. AMX and
    AVX-512 both have the kernel: the later of them is that side's line, its machine column naming its tier."""
    amx = {**MACH, "cpu": "Intel(R) Xeon(R) Processor", "fp8_tier": "AMX"}
    avx512 = {**MACH, "fp8_tier": "AVX-512"}
    recs = [
        {**_rec("suite", 1007.4, commit="aaa1111"), "machine": amx},
        _rec("suite", 700.0, commit="bbb2222"),
        {**_rec("suite", 960.0, commit="ccc3333"), "machine": amx},
    ]
    suite = [r for r in bench.table(recs).splitlines() if r.startswith("| test suite")]
    assert len(suite) == 2
    assert "| 16.0 min |" in suite[0] and "`ccc3333`" in suite[0] and "(AMX) |" in suite[0]  # its latest, first seen
    assert "| 11.7 min |" in suite[1] and "`bbb2222`" in suite[1] and "(AVX2, no FP8 KV kernel) |" in suite[1]
    recs.append({**_rec("suite", 804.0, commit="ddd4444"), "machine": avx512})
    suite = [r for r in bench.table(recs).splitlines() if r.startswith("| test suite")]
    assert len(suite) == 2 and "| 13.4 min |" in suite[0] and "`ddd4444`" in suite[0] and "(AVX-512) |" in suite[0]
    assert "`bbb2222`" in suite[1]
