#!/usr/bin/env bash
# Set up the CPU environment and run every test a CPU can run (unit, real-vLLM integration, notebooks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh
# the browser tier (tests/browser) opens the exported HTML in Debian's chromium, headless
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
  else
    echo "chromium is missing and cannot be installed here (needs root and apt-get): tests/browser will fail" >&2
  fi
fi
exec .venv/bin/python -m pytest -m "not gpu" --durations=30 "$@"
