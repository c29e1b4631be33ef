#!/usr/bin/env bash
# Set up the CPU environment and run the main job: every study notebook on the shipped model with CPU
# vLLM (profile cpu-tiny), writing executed notebooks, HTML, index.html and summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
exec .venv/bin/fp8lab run --profile cpu-tiny --out "${1:-reports/cpu-tiny}"
