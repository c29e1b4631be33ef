#!/usr/bin/env bash
# Run study notebooks on the GPU host with the h200 profile and pack what they produced into $OUT.
# Usage on the host, after ../shared/gpu-host/ staging (setup.sh installed vLLM 0.26.0 into /tmp/site):
#   FP8LAB_COMMIT=<sha> bash scripts/h200_run.sh 01 03
#   FP8LAB_COMMIT=<sha> FP8LAB_ARGS="-p RUN_FIDELITY True" FP8LAB_TAG=01-fidelity bash scripts/h200_run.sh 01
#   FP8LAB_COMMIT=<sha> FP8LAB_PROFILE=h200-shipped bash scripts/h200_run.sh 01   (another profile; default h200)
# Longer than one call (Study 01's paired design: about 20 minutes): scripts/h200_bg.sh, same arguments.
# FP8LAB_SEED_RECORDS=1 first unpacks the committed stores ($FP8LAB_SEED_DIR/*.tar.gz; default reports/h200/records,
# reports/h200/<X>/records for profile h200-<X>, reports/<profile>/records for any other) into $FP8LAB_RUNS,
# so engines an earlier session finished (same spec, same phases, same repo path) are loaded, not re-run.
# FP8LAB_REUSE_STORED=1 (with FP8LAB_SEED_RECORDS=1) also loads a seeded run that this vLLM measured under older fp8lab
# engine code (fp8lab.engine.results.reusable): re-measure one part of a study and keep the rest (Study 04's quality
# engines beside its 2026-11-29 ramp, reports/h200/README.md session 10).
# FP8LAB_BUDGET_S (default 540) bounds the notebooks' run so the packing below still happens inside one
# `run` call's 600 s; a notebook cut short leaves its finished engine runs in $FP8LAB_RUNS, and the same
# command on the same warm host resumes from them (fp8lab.engine.results skips finished runs).
# Study 06's engine sets (issue 35) stop between sets at FP8LAB_DEADLINE = now + budget - FP8LAB_DEADLINE_MARGIN_S
# (default 60 s: the notebook's tables, plots and HTML, then the packing), so a call ends with whole engine sets; the
# same command on the same warm host measures the sets left (a cold host: FP8LAB_SEED_RECORDS=1 with FP8LAB_SEED_DIR
# holding the previous call's runs-<tag>.tar.gz). Study 06 replicated, about 850 s in two calls (fp8lab/profiles.yaml):
#   FP8LAB_COMMIT=<sha> FP8LAB_TAG=06-replicated FP8LAB_ARGS="-p RECORDS null -p BANDWIDTH_GBS 4069.9173720405943" \
#     bash scripts/h200_run.sh 06          (twice; the second call resumes)
# Writes $OUT/report-<tag>.tar.gz (executed notebooks, HTML, summaries, index.html, the installed vLLM's
# options as vllm-options-<version>.json) and $OUT/runs-<tag>.tar.gz (the results store: spec, records,
# provenance and worker log of every engine of this call's studies).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PYTHONUNBUFFERED=1
export FP8LAB_RUNS=${FP8LAB_RUNS:-/tmp/fp8lab-runs}
# The staged xgrammar 0.2.9 calls tvm_ffi's load_lib_module with a keyword that the staged
# apache-tvm-ffi 0.1.10 lacks; without it every engine fails at start (reports/h200/foundation/README.md).
sed -i 's/, extra_lib_paths=package_paths)/)/' /tmp/site/xgrammar/load_binding.py 2>/dev/null || true
profile=${FP8LAB_PROFILE:-h200}
tag=${FP8LAB_TAG:-$(IFS=-; echo "$*")}
out=/tmp/h200report/$tag
mkdir -p "$out" "$FP8LAB_RUNS"
if [ "${FP8LAB_SEED_RECORDS:-0}" = 1 ]; then
  case $profile in h200-*) seed=reports/h200/${profile#h200-}/records ;; *) seed=reports/$profile/records ;; esac
  for t in "${FP8LAB_SEED_DIR:-$seed}"/*.tar.gz; do [ -e "$t" ] && tar xzf "$t" -C "$FP8LAB_RUNS"; done
  ls "$FP8LAB_RUNS"
fi
ver=$(python3 -c "import vllm; print(vllm.__version__)" 2>/dev/null || echo unknown)
python3 -m fp8lab.vllm_options --out "$out/vllm-options-$ver.json" > "$out/vllm-options.log" 2>&1 &
export FP8LAB_DEADLINE=$(( $(date +%s) + ${FP8LAB_BUDGET_S:-540} - ${FP8LAB_DEADLINE_MARGIN_S:-60} ))
# shellcheck disable=SC2086  # FP8LAB_ARGS is a list of words
timeout --signal=INT --kill-after=20 "${FP8LAB_BUDGET_S:-540}" \
  python3 -m fp8lab.cli run "$@" --profile "$profile" --out "$out" -q ${FP8LAB_ARGS:-}
rc=$?
if [ "$rc" -ne 0 ]; then  # cut short: stop what still holds the GPU (kernels, spawned engine workers)
  pkill -9 -f ipykernel_launcher || true
  nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | xargs -r kill -9 || true
fi
wait
tar czf "$OUT/report-$tag.tar.gz" -C "$out" .
tar czf "$OUT/runs-$tag.tar.gz" -C "$FP8LAB_RUNS" .
ls -la "$OUT"
exit $rc
