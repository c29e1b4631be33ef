"""``fp8lab estimate``: the JSON contract, the readable table, clean errors, and no torch/vLLM import."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from fp8lab.estimate_cli import add_estimate_parser, run_estimate
from fp8lab.paths import CONFIGS_DIR, REPO_ROOT

#: The shipped model's shape: 2 x 6 layers x 2 kv heads x 64 x 2 bytes = 3,072 B/token.
TINY = {
    "model_type": "qwen3",
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_size": 256,
    "vocab_size": 4096,
    "intermediate_size": 768,
    "dtype": "bfloat16",
}
QWEN3_8B = str(CONFIGS_DIR / "qwen3-8b")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(*argv, capsys):
    parser = argparse.ArgumentParser(prog="fp8lab")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *argv])
    rc = run_estimate(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture()
def tiny_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return str(tmp_path)


def test_json_contract_subprocess():
    # the command other tools run; Qwen3-8B fp8: 2 x 36 x 8 x 128 x 1 byte = 73,728 B/token
    cmd = [sys.executable, "-m", "fp8lab.cli", "estimate", QWEN3_8B, "--kv-dtype", "fp8", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # one JSON object and nothing else
    assert out["kv_bytes_per_token"] == 73728 and isinstance(out["kv_bytes_per_token"], int)
    assert (out["kv_dtype"], out["kv_dtype_bytes"], out["num_layers"]) == ("fp8", 1, 36)


def test_auto_is_the_config_dtype(capsys):
    # 2 x 36 x 8 x 128 x 2 (bfloat16) = 147,456
    rc, out, _ = _run(QWEN3_8B, "--json", capsys=capsys)
    assert rc == 0 and json.loads(out)["kv_bytes_per_token"] == 147456


def test_config_json_path_and_data_configs_name(capsys):
    rc, out, _ = _run(str(CONFIGS_DIR / "llama-3-70b" / "config.json"), "--json", capsys=capsys)
    assert rc == 0 and json.loads(out)["kv_bytes_per_token"] == 327680  # 2 x 80 x 8 x 128 x 2
    rc, out, _ = _run("deepseek-v2-lite", "--json", capsys=capsys)  # a folder name under data/configs
    assert rc == 0 and json.loads(out)["kv_bytes_per_token"] == 31104  # 27 x (512 + 64) x 2, MLA


def test_blocks_capacity_concurrency(tiny_dir, capsys):
    # 1 GiB, block 128: 1,073,741,824 // (128 x 3,072) = 2730 blocks, 2730 x 128 = 349,440 tokens;
    # 2048-token sequences need 16 blocks: 2730 // 16 = 170
    rc, out, _ = _run(
        tiny_dir, "--memory-gib", "1", "--block-size", "128", "--context-len", "2048", "--json", capsys=capsys
    )
    d = json.loads(out)
    assert rc == 0
    assert (d["kv_bytes_per_token"], d["page_bytes"], d["num_blocks"]) == (3072, 393216, 2730)
    assert (d["capacity_tokens"], d["max_concurrency"]) == (349440, 170)
    assert d["kv_bytes_per_sequence"] == 2048 * 3072 and d["kv_budget_bytes"] == 1 << 30


def test_tp_is_per_rank(capsys):
    # Llama-3-70B on 8 ranks: 1 kv head per rank, 2 x 80 x 1 x 128 x 2 = 40,960 B per rank
    rc, out, _ = _run("llama-3-70b", "--tp", "8", "--json", capsys=capsys)
    d = json.loads(out)
    assert rc == 0 and (d["kv_bytes_per_token"], d["kv_heads_per_rank"], d["kv_bytes_per_token_all_ranks"]) == (
        40960,
        1,
        327680,
    )


def test_readable_table(capsys):
    rc, out, _ = _run(QWEN3_8B, "--kv-dtype", "fp8", capsys=capsys)
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("kv_bytes_per_token "))
    assert "73,728" in line and "B" in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["does/not/exist"], "path = 'does/not/exist'"),
        ([QWEN3_8B, "--kv-dtype", "fp9"], "kv_dtype = 'fp9': the installed vLLM "),
        ([QWEN3_8B, "--tp", "3"], "tp = 3: a divisor or a multiple of num_key_value_heads = 8"),
        ([QWEN3_8B, "--tp", "two"], "tp = 'two': an integer >= 1"),
        ([QWEN3_8B, "--block-size", "0"], "block_size = 0: an integer >= 1"),
        ([QWEN3_8B, "--memory-gib", "-1"], "memory_gib = -1.0: a number > 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    rc, out, err = _run(*argv, capsys=capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_config_without_needed_fields(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 8}))
    rc, _, err = _run(str(tmp_path), capsys=capsys)
    assert rc == 2 and "num_hidden_layers = None: a positive integer" in err
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in TINY.items() if k != "dtype"}))
    rc, _, err = _run(str(tmp_path), capsys=capsys)  # auto needs the model dtype
    assert rc == 2 and "torch_dtype = None" in err
    rc, out, _ = _run(str(tmp_path), "--kv-dtype", "fp8", "--json", capsys=capsys)  # fp8 does not
    assert rc == 0 and json.loads(out)["kv_bytes_per_token"] == 1536


def test_no_traceback_on_bad_input():
    cmd = [sys.executable, "-m", "fp8lab.cli", "estimate", "does/not/exist", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("module", ["fp8lab.cli", "fp8lab.estimate_cli"])
def test_estimate_imports_neither_torch_nor_vllm(module):
    code = (
        "import sys, json\n"
        f"from {module} import main\n"
        f"rc = main({['estimate', QWEN3_8B, '--json'] if module == 'fp8lab.cli' else [QWEN3_8B, '--json']!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'numpy', 'pandas'))\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=_env(), timeout=120
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report == {"rc": 0, "heavy": []}
