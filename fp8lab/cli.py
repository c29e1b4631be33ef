"""The ``fp8lab`` command.

``fp8lab estimate PATH --kv-dtype auto|fp8 [--json]``: the KV-cache calculator (no torch, no vLLM).
``fp8lab advise MODEL [--gpu h200] [--context N --batch B | --mix C:S,...]``: per KV dtype, capacity, concurrency and
the predicted decode step from the H200 fits (:mod:`fp8lab.advise`; ``--validate`` writes its held-out check).
``fp8lab run [--profile NAME] [--out DIR] [notebooks...]``: execute the studies headlessly and write
HTML reports, ``index.html`` and ``summary.json``.
``fp8lab doctor [--model DIR] [--json] [--probe]``: which KV dtypes run natively here, and why not
(:mod:`fp8lab.engine.capability`), and every KV format the installed vLLM accepts: starts here or why not
(:mod:`fp8lab.dtypes.doctor`: a stored Study 08 run of this machine, else vLLM's own answer; ``--probe`` starts one
small engine per format that answer does not refuse).
``fp8lab model [--check] [--gguf PATH] [--force] [--path]``: make (or check) the real model, SmolLM2-135M-Instruct,
in its cache folder (:mod:`fp8lab.realmodel`; ``MODEL: smollm2-135m-instruct`` names it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from fp8lab.errors import SpecError


def _parse_value(name: str, text: str):
    """``-p NAME VALUE`` values are YAML (numbers, lists, null), as papermill's ``-y`` would take them."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem", None) or type(exc).__name__
        raise SpecError("RunSpec", name, text, f"a YAML value (a number, a string, a list, null): {where}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from fp8lab.report.run import run_profile

    overrides = {name: _parse_value(name, value) for name, value in (args.param or [])}
    out = Path(args.out or f"reports/{args.profile}")
    summary = run_profile(args.profile, out, args.notebooks or None, overrides, progress=not args.quiet)
    ran = summary["ran_now"]  # not those of an earlier run
    failed = [n for n, e in ran.items() if e["status"] != "ok"]
    print(f"fp8lab run: {len(ran) - len(failed)} ok, {len(failed)} failed -> {out / 'index.html'}")
    for n in failed:
        kept = " (the last good result in that folder is kept)" if summary["notebooks"][n].get("rerun_failed") else ""
        print(
            f"  failed: {n}: {ran[n]['error']}{kept}; the failed notebook: {out / (n + '.failed.html')}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def cmd_runs(args: argparse.Namespace) -> int:
    from fp8lab.engine.results import phase_table

    root = Path(args.root) if args.root else None
    table = phase_table(args.study, root)
    if table.empty:
        print(
            f"fp8lab runs: no stored runs of study {args.study!r} under {root or 'the results store'}", file=sys.stderr
        )
        return 1
    print(
        table.drop(columns=["run_id"]).round(1).to_markdown(index=False)
        if args.markdown
        else table.to_string(index=False)
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fp8lab.report.run import compare_summaries

    try:
        table = compare_summaries(args.reports, args.notebook, args.keys)
    except (FileNotFoundError, re.error) as exc:
        print(f"fp8lab compare: error: {exc}", file=sys.stderr)
        return 2
    print(table.to_markdown(floatfmt=".4g") if args.markdown else table.to_string())
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from fp8lab.profiles import load_profiles

    profiles = load_profiles()
    if args.json:
        print(json.dumps(profiles, indent=2))
    else:
        for name, p in profiles.items():
            print(f"{name}: {' '.join(str(p.get('description', '')).split())}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from fp8lab.dtypes.doctor import format_matrix, machine_matrix
    from fp8lab.engine.capability import format_report, report
    from fp8lab.specs import resolve_model

    model = resolve_model(args.model) if args.model else None
    rep = report(model)
    rep["kv_formats"] = machine_matrix(model, probe=args.probe)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep) + "\n" + format_matrix(rep["kv_formats"]))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from fp8lab import realmodel

    return realmodel.run(args)


def build_parser() -> argparse.ArgumentParser:
    from fp8lab.advise import add_advise_parser
    from fp8lab.estimate_cli import add_estimate_parser

    parser = argparse.ArgumentParser(prog="fp8lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_estimate_parser(sub)
    add_advise_parser(sub)

    run = sub.add_parser("run", help="execute the study notebooks on a profile and write HTML reports")
    run.add_argument("notebooks", nargs="*", help="notebook names or paths (default: every notebooks/NN_*.ipynb)")
    run.add_argument("--profile", default="cpu-tiny", help="a profile of fp8lab/profiles.yaml (default: cpu-tiny)")
    run.add_argument("--out", help="output folder (default: reports/<profile>)")
    run.add_argument(
        "-p",
        "--param",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        help="override one notebook parameter (YAML value), e.g. -p KV_CACHE_GIB 2",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    runs = sub.add_parser("runs", help="tabulate a study's stored runs per workload phase (tokens/s, TTFT, TPOT)")
    runs.add_argument("study", help="study folder in the results store, e.g. 01_kv_dtype_auto_vs_fp8")
    runs.add_argument("--root", help="results store root (default: $FP8LAB_RUNS or runs/)")
    runs.add_argument("--markdown", action="store_true", help="a Markdown table")
    runs.set_defaults(func=cmd_runs)

    cmp = sub.add_parser("compare", help="one notebook's key numbers across report folders, side by side")
    cmp.add_argument("notebook", help="notebook stem, e.g. 03_quality_token_match")
    cmp.add_argument("reports", nargs="+", help="report folders, e.g. reports/cpu-tiny reports/h200")
    cmp.add_argument("--keys", default=".", help="regular expression the summary keys must match")
    cmp.add_argument("--markdown", action="store_true", help="a Markdown table")
    cmp.set_defaults(func=cmd_compare)

    prof = sub.add_parser("profiles", help="list the named parameter sets")
    prof.add_argument("--json", action="store_true")
    prof.set_defaults(func=cmd_profiles)

    doc = sub.add_parser("doctor", help="which KV dtypes the installed vLLM runs natively on this device, and why not")
    doc.add_argument("--model", help="a model folder: its head_dim is checked too (CPU FP8 needs head_dim % 32 == 0)")
    doc.add_argument("--json", action="store_true")
    doc.add_argument(
        "--probe",
        action="store_true",
        help="start one small engine per KV format vLLM's answer does not refuse (Study 08 on the model; minutes)",
    )
    doc.set_defaults(func=cmd_doctor)

    from fp8lab import realmodel

    mod = sub.add_parser(
        "model", help=f"make the real model ({realmodel.FOLDER}, MODEL: {realmodel.NAME}) in its cache, or check it"
    )
    realmodel.add_arguments(mod)
    mod.set_defaults(func=cmd_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecError as exc:
        print(f"fp8lab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
