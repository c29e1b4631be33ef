#!/usr/bin/env bash
# Run study notebooks on the GPU host with the h200 profile and pack what they produced into $OUT.
# Usage on the host, after ../shared/gpu-host/ staging (setup.sh installed vLLM 0.26.0 into /tmp/site):
#   FP8LAB_COMMIT=<sha> bash scripts/h200_run.sh 01 03
# Writes $OUT/report-<notebooks>.tar.gz (executed notebooks, HTML, summaries, index.html) and
# $OUT/runs-<notebooks>.tar.gz (the results store: spec, records, provenance of every engine).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PYTHONUNBUFFERED=1
export FP8LAB_RUNS=${FP8LAB_RUNS:-/tmp/fp8lab-runs}
# The staged xgrammar 0.2.9 calls tvm_ffi's load_lib_module with a keyword that the staged
# apache-tvm-ffi 0.1.10 lacks; without it every engine fails at start (reports/h200/foundation/README.md).
sed -i 's/, extra_lib_paths=package_paths)/)/' /tmp/site/xgrammar/load_binding.py 2>/dev/null || true
tag=$(IFS=-; echo "$*")
out=/tmp/h200report
mkdir -p "$out"
python3 -m fp8lab.cli run "$@" --profile h200 --out "$out" -q
rc=$?
tar czf "$OUT/report-$tag.tar.gz" -C "$out" .
tar czf "$OUT/runs-$tag.tar.gz" -C "$FP8LAB_RUNS" .
ls -la "$OUT"
exit $rc
