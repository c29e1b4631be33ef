#!/usr/bin/env bash
# Set up the CPU environment and run every test a CPU can run (unit, real-vLLM integration, notebooks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
exec .venv/bin/python -m pytest -m "not gpu" "$@"
