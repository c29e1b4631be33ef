"""The claims of the field reports, as data (:class:`Claim`, :data:`CLAIMS`, :data:`CLAIMS_BY_ID`): each with the
claim as the reports put it, a short paraphrase, the setting it was reported in, what evidence can decide it
(``needs``) and the studies whose records are that evidence. The rules that judge them are in ``rules_*.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One claim of the field reports: ``id`` (a number, with a letter where one report sentence holds two
    claims), ``text`` (a short paraphrase), ``quote`` (the claim as the reports put it, as the project's issues
    record it), ``source`` (the setting it was reported in), ``needs`` (what evidence can decide it, see
    :data:`Needs`), ``studies`` (the prefixes of the notebooks whose records are its evidence)."""

    id: str
    text: str
    source: str
    quote: str = ""
    needs: str = "any"
    studies: tuple[str, ...] = ()


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "1",
        "KV memory = 2 x layers x attention heads x head_dim x seq x batch x bytes.",
        "field reports' general formula (any model)",
        "KV memory = 2 x layers x *attention heads* x head_dim x seq x batch x bytes",
        "any",
        ("00",),
    ),
    Claim(
        "2",
        "Llama-3-70B at 128K needs about 128 GB of FP16 KV cache; FP8 cuts 32 bytes per token to 8.",
        "Llama-3-70B, 128K context (GPU and engine not stated)",
        'about 128 GB of FP16 KV cache ... "32 bytes per token to 8"',
        "any",
        ("00",),
    ),
    Claim(
        "3a",
        "FP8 halves the KV cache.",
        "Qwen3-14B on vLLM; Llama-2-70B on SGLang, A100",
        "FP8 halves the KV cache",
        "gpu",
        ("00", "01"),
    ),
    Claim(
        "3b",
        "Total peak memory drops only about 23-25% with FP8 (68.2 -> 52.7 GB on Qwen3-14B), because the "
        "KV cache is only part of memory.",
        "Qwen3-14B on vLLM (GPU not stated)",
        "total peak memory drops only about 23-25% (68.2 -> 52.7 GB on Qwen3-14B; 78,456 -> 59,214 MiB on Llama-2-70B)",
        "gpu-model",
        ("00", "01"),
    ),
    Claim(
        "4a",
        "FP8 doubles the supported concurrency (32 -> 64).",
        "Qwen3-14B on vLLM (GPU not stated)",
        "FP8 doubles the supported concurrency (32 -> 64 on Qwen3-14B)",
        "gpu",
        ("01", "04"),
    ),
    Claim(
        "4b",
        "FP8 raises the supported concurrency 50% (16 -> 24).",
        "Llama-2-70B on SGLang, A100",
        "raises it 50% (16 -> 24, Llama-2-70B)",
        "sglang",
        ("01", "04"),
    ),
    Claim(
        "5",
        "On a 6:3:1 short/medium/long mix FP8 lowers throughput 7.9%, improves TTFT slightly and worsens TPOT.",
        "Qwen3-14B on vLLM; mix (128 in, 64 out), (1024, 256), (8192, 512) at 6:3:1 (GPU not stated)",
        "throughput 1842 -> 1697 tok/s (-7.9%), TTFT 320 -> 298 ms, TPOT 28 -> 34 ms",
        "gpu-model",
        ("01",),
    ),
    Claim(
        "6a",
        "On long requests (8192 in, 512 out) bf16 runs out of memory at a concurrency where FP8 still runs.",
        "Qwen3-14B on vLLM (GPU not stated)",
        "bf16 runs out of memory at a concurrency where FP8 still runs",
        "gpu",
        ("04", "01"),
    ),
    Claim(
        "6b",
        "On long requests (8192 in, 512 out) FP8 raises throughput 18.3%.",
        "Qwen3-14B on vLLM (GPU not stated)",
        "FP8 raises throughput 18.3%",
        "gpu-model",
        ("06", "04"),
    ),
    Claim(
        "7",
        "FP8's throughput loss grows with batch size (-1.7% at 1, -2.9% at 8, -4.4% at 16) while TTFT/TPOT "
        "barely move.",
        "Llama-2-70B on SGLang, A100",
        "-1.7% at 1, -2.9% at 8, -4.4% at 16 ... TTFT/TPOT barely move",
        "sglang",
        ("01", "06"),
    ),
    Claim(
        "8",
        "A fixed-thread closed-loop load test that does not read the stream overstated FP8's gain (+30%).",
        "Qwen3-14B on vLLM (the report's own first benchmark, an HTTP client)",
        "a closed-loop test that did not read the stream reported +30%; a constant-rate streaming test is needed",
        "gpu",
        ("01",),
    ),
    Claim(
        "9",
        "E4M3 has 4 exponent bits and a wider dynamic range, E5M2 higher precision, and E4M3's maximum of "
        "448 is what matters for attention scores.",
        "field reports' description of the formats",
        'E4M3 has "4 exponent bits and a wider dynamic range", E5M2 "higher precision"',
        "any",
        ("03", "02"),
    ),
    Claim(
        "10",
        "Scales from one 32-token prompt match a 2.4K-sample calibration within 0.03 on average.",
        "field report on vLLM FP8 KV scales (model not stated)",
        "the average difference is below 0.03",
        "any",
        ("02",),
    ),
    Claim(
        "11a",
        "With good calibration the top-3 token match rate is 0.92-0.96.",
        "field report's protocol: first 3 greedy tokens of fp8 vs the baseline (vLLM, GPU)",
        "top-3 token match rate 0.92-0.96",
        "gpu",
        ("02", "03"),
    ),
    Claim(
        "11b",
        "A top-3 match rate below 0.85 means calibration failed.",
        "field report's protocol (vLLM, GPU)",
        "below 0.85 means calibration failed",
        "gpu",
        ("03", "02"),
    ),
    Claim(
        "12a",
        "At 128K, block_size 256 beats 16 (P99 12.4 s -> 5.7 s).",
        "long-context field reports, 128K (model, GPU and engine not stated)",
        "P99 12.4 s -> 5.7 s",
        "gpu-model",
        ("04",),
    ),
    Claim(
        "12b",
        "FP8 and block size 256 raise the KV cache hit rate.",
        "long-context field reports, 128K",
        'FP8 + block 256 raise the KV "hit rate"',
        "gpu",
        ("04",),
    ),
    Claim(
        "13a",
        "FP8's gain is largest at batch 1 (+130%) and narrows as batch grows.",
        "long-context field reports (model, GPU and engine not stated)",
        "+130% at batch 1, narrowing as batch grows",
        "gpu-model",
        ("06", "01"),
    ),
    Claim(
        "13b",
        "FP8 cuts TTFT 47% and ITL 65% at 128K.",
        "long-context field reports (model, GPU, engine not stated)",
        "TTFT -47%, ITL -65% at 128K",
        "gpu-model",
        ("06", "04"),
    ),
    Claim(
        "14",
        "vLLM's FP8 KV path updates per-head scales dynamically during decode.",
        "field report on vLLM (version not stated)",
        "per-head scales updated dynamically during decode",
        "gpu",
        ("02",),
    ),
    Claim(
        "15",
        "These vLLM options exist: --fp8-padding-threshold, --fp8-w8a16, --quant-aware, --fp8-use-matrix, "
        "--attention-reduction, --max-num-prompt-tokens, and a request header that switches one request to FP16.",
        "field report on vLLM (version not stated)",
        "",
        "any",
        (),
    ),
    Claim(
        "16",
        "The prefix (radix) cache hit rate is unaffected by FP8 (68.3% -> 67.9%).",
        "Qwen3-14B on vLLM / SGLang (GPU not stated)",
        "radix cache hit rate 68.3 -> 67.9%",
        "gpu",
        ("07",),
    ),
    Claim(
        "17",
        "FP8 improves the TPOT P95 of long requests.",
        "Qwen3-14B on vLLM (GPU not stated)",
        "TPOT P95 of long requests improves",
        "gpu-model",
        ("06", "01"),
    ),
    Claim(
        "18",
        "A100 Tensor Cores natively support E4M3.",
        "field report (hardware)",
        "A100 Tensor Cores natively support E4M3",
        "any",
        (),
    ),
    Claim(
        "19",
        "Ada (RTX 40 / L4 / L40) lacks FP8 acceleration.",
        "field report (hardware)",
        "Ada lacks FP8 acceleration",
        "any",
        (),
    ),
    Claim(
        "20",
        "Llama-2-70B runs in FP16 on one 80 GB A100.",
        "Llama-2-70B on SGLang, A100",
        "Llama-2-70B, FP16, one A100 80 GB",
        "any",
        (),
    ),
    Claim(
        "21",
        "Llama-2-70B serves 1,842 tok/s at batch 1.",
        "Llama-2-70B on SGLang, A100 80 GB",
        "1,842 tok/s at batch 1",
        "any",
        (),
    ),
    Claim(
        "22",
        "At 128K FP8 raises throughput from 18 to 42 tok/s.",
        "long-context field reports, 128K",
        "128K throughput 18 -> 42 tok/s",
        "gpu-model",
        ("06",),
    ),
    Claim(
        "23",
        "With FP8 at 128K, chunked prefill raises throughput from 42 to 51 tok/s.",
        "long-context field reports, 128K",
        "chunked prefill 42 -> 51 tok/s",
        "gpu-model",
        ("04",),
    ),
    Claim(
        "24",
        "FP8's TTFT spread is one fifth of FP16's.",
        "long-context field reports",
        "TTFT spread one fifth of FP16's",
        "gpu-model",
        ("01",),
    ),
    Claim("25", "The measurements used vLLM 2.3 / 2.4.", "field reports (versions)", 'vLLM "2.3/2.4"', "any", ()),
    Claim(
        "26",
        "vLLM re-captures CUDA graphs at every batch-size change.",
        "field report on vLLM",
        "CUDA graphs re-captured at every batch-size change",
        "any",
        (),
    ),
    Claim(
        "27",
        "Past E4M3's maximum of 448 values fail silently (no error, wrong values).",
        "long-context field reports",
        "the silent failure past E4M3's 448",
        "any",
        ("02",),
    ),
    Claim(
        "28",
        "Random-token prompts are worthless for testing FP8 KV.",
        "long-context field reports",
        '"random tokens are worthless" for testing',
        "any",
        ("04",),
    ),
)
CLAIMS_BY_ID: Mapping[str, Claim] = {c.id: c for c in CLAIMS}
