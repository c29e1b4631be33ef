#!/usr/bin/env bash
# Runs longer than one `run` call's 10 minutes on the GPU host: start scripts/h200_run.sh in its own process
# session (setsid: it outlives the call while the machine stays warm), then wait for it. Call the same command
# again (within the host's 30 s warm window after the previous call) until it reports "finished"; each call
# waits at most FP8LAB_WAIT_S (default 570 s) and copies the report and runs tarballs into $OUT once finished.
# Usage on the host (after ../shared/gpu-host staging; arguments as for h200_run.sh):
#   FP8LAB_COMMIT=<sha> FP8LAB_PROFILE=h200 FP8LAB_TAG=01-paired bash scripts/h200_bg.sh 01
# The first call prints Study 01's time plan (python -m fp8lab.serving) before any engine starts.
# FP8LAB_BUDGET_S (default 1680 s here) bounds the whole notebook run; a run cut short resumes from its finished
# phases when started again on the same warm host (rm -rf /tmp/h200bg-<tag> first). State: /tmp/h200bg-<tag>/.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PYTHONUNBUFFERED=1
tag=${FP8LAB_TAG:-$(IFS=-; echo "$*")}
state=/tmp/h200bg-$tag
export FP8LAB_TAG=$tag
mkdir -p "$state/out"
if [ ! -e "$state/started" ]; then
  date -u > "$state/started"
  args=()
  for a in ${FP8LAB_ARGS:-}; do args+=("$a"); done
  plan=()
  for ((i = 0; i < ${#args[@]}; i++)); do  # -p NAME VALUE pairs for the time plan
    if [ "${args[$i]}" = "-p" ]; then plan+=(-p "${args[$((i + 1))]}" "${args[$((i + 2))]}"); i=$((i + 2)); fi
  done
  case " $* " in *" 01 "*) python3 -m fp8lab.serving --profile "${FP8LAB_PROFILE:-h200}" "${plan[@]}" ;; esac
  FP8LAB_BUDGET_S=${FP8LAB_BUDGET_S:-1680} OUT=$state/out setsid nohup bash -c \
    "bash scripts/h200_run.sh \"\$@\"; echo \$? > $state/done" _ "$@" > "$state/log" 2>&1 < /dev/null &
  echo "started in the background ($(cat "$state/started")); log: $state/log"
fi
deadline=$((SECONDS + ${FP8LAB_WAIT_S:-570}))
while [ ! -e "$state/done" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
grep -E "engine kv_cache_dtype|^\[[0-9]+/[0-9]+\]|paired study|plan:|Error|error" "$state/log" | tail -n 60
find "${FP8LAB_RUNS:-/tmp/fp8lab-runs}" -name 'phase-*.json.gz' 2>/dev/null | wc -l | xargs echo "phases kept so far:"
if [ -e "$state/done" ]; then
  echo "finished: exit code $(cat "$state/done")"
  tail -n 30 "$state/log"
  cp "$state"/out/* "$OUT"/ 2>/dev/null
  ls -la "$OUT"
else
  echo "still running ($(date -u)); call again within 30 s to keep the host warm"
fi
