"""The H200 host's SmolLM2-135M-Instruct folder, rebuilt here to re-render the host's Study 02 and 03 stores.

    .venv/bin/python scripts/host_model_folder.py STORE_DIR OUT_MODELS_DIR
    FP8LAB_MODELS=OUT_MODELS_DIR FP8LAB_RUNS=STORE_DIR FP8LAB_STORE_ONLY=1 .venv/bin/fp8lab run 02 --profile h200 ...

Until 2026-12-04 the host converted the GGUF with transformers 5.17, which wrote ``<|im_start|>`` as the EOS in
``tokenizer_config.json`` (fp8lab.realmodel now writes the GGUF's own tokens). The EOS joins the held-out documents
that Studies 02 and 03 score, so their perplexity and copy-task requests, and their run keys, follow it. This copies
this machine's converted folder, puts in the host's ``tokenizer_config.json`` (kept in the store beside each of
Study 02's scale sets) and writes the manifest for it; weights and config are this machine's, the same bytes (the
run keys' model digest checks them).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from fp8lab import realmodel


def main(store: str, out: str) -> Path:
    host_cfg = sorted(Path(store).glob("02_calibration/scalesets/*/*/tokenizer_config.json"))
    if not host_cfg:
        raise SystemExit(f"no scale set's tokenizer_config.json under {store}/02_calibration/scalesets")
    dst = Path(out) / realmodel.model_dir().name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(realmodel.check(), dst)
    shutil.copy(host_cfg[0], dst / "tokenizer_config.json")
    man = json.loads((dst / realmodel.MANIFEST).read_text())
    man["files"]["tokenizer_config.json"] = realmodel.file_entry(dst / "tokenizer_config.json")  # the one file changed
    man["digest"] = realmodel.files_digest(man["files"])
    (dst / realmodel.MANIFEST).write_text(json.dumps(man, indent=2) + "\n", encoding="utf-8")
    print(f"{dst}: {realmodel.check(dst)} (EOS {json.loads(host_cfg[0].read_text()).get('eos_token')!r})")
    return dst


if __name__ == "__main__":
    main(*sys.argv[1:3])
