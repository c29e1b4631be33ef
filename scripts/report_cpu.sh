#!/usr/bin/env bash
# Set up the CPU environment and run the main job: every study notebook and the audit on the shipped model with
# CPU vLLM, writing executed notebooks, HTML, index.html and summary.json to out/<profile>/ (a folder of your own,
# ignored by git), or to the folder given as $1. $2 picks the profile: cpu-quick (default: the first report, about
# 10 minutes on 2 cores after setup) or cpu-tiny (the fuller run, its quality studies on the real model: over an
# hour on 2 cores; the committed reference is
# refreshed on purpose with `bash scripts/report_cpu.sh reports/cpu-tiny cpu-tiny`). Even there a notebook that
# fails replaces nothing: its last good result stays and the failed run is kept beside it as NN_*.failed.html.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${2:-cpu-quick}
bash scripts/setup_cpu.sh
exec .venv/bin/fp8lab run --profile "$profile" --out "${1:-out/$profile}"
