#!/usr/bin/env bash
# Set up the CPU environment and run the main job: every study notebook on the shipped model with CPU
# vLLM (profile cpu-tiny), writing executed notebooks, HTML, index.html and summary.json to out/cpu-tiny/
# (a folder of your own, ignored by git), or to the folder given as $1. The committed reference report is
# refreshed on purpose with `bash scripts/report_cpu.sh reports/cpu-tiny`; even there a notebook that fails
# replaces nothing: its last good result stays and the failed run is kept beside it as NN_*.failed.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
exec .venv/bin/fp8lab run --profile cpu-tiny --out "${1:-out/cpu-tiny}"
