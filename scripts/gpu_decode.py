"""Run Study 06's measurement for a profile on this machine, without the notebook (the notebook renders the
report later, anywhere, from the stored run: its ``RECORDS`` parameter).

    python scripts/gpu_decode.py PROFILE [-p NAME VALUE ...]      e.g. h200 -p GPU_GROUPS '[[0], [1]]'

Writes the run into ``$FP8LAB_RUNS`` (default ``runs/``): rows as they are measured, engine facts, the memory
bandwidth measured after the engines exit (``bandwidth.json``), and prints the plan, the summary and the verdict.
The same command again resumes an incomplete run.
"""

import json
import os
import sys
from pathlib import Path

import yaml

from fp8lab import decode, profiles

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_decode_speed.ipynb"

if __name__ == "__main__":
    args = sys.argv[1:]
    profile = args.pop(0)
    overrides = {}
    while args:
        flag, name, value = args[:3]
        if flag != "-p":
            sys.exit(f"usage: gpu_decode.py PROFILE [-p NAME VALUE ...]; got {flag!r}")
        overrides[name] = yaml.safe_load(value)
        args = args[3:]
    params = profiles.resolved_parameters(NOTEBOOK, profiles.load_profile(profile), overrides)
    spec = decode.DecodeSpec.from_params(params)
    print(decode.plan(spec).to_string(), flush=True)
    run = decode.run_decode(spec, Path(os.environ.get("FP8LAB_RUNS", "runs")))
    print("run", run.run_dir, "complete", run.complete, flush=True)
    bw = decode.store_bandwidth(run)
    s = decode.summary(run, bw["bandwidth_gbs"])
    print(json.dumps(s, indent=1, default=str))
    print("\n".join(decode.verdict(s)))
