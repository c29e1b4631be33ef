"""Serving metrics: latency percentiles, throughput, decode steps (pure numpy/pandas: no vLLM, no torch).

Units: seconds for latencies in the data (tables may show milliseconds and say so), tokens per second
for throughput, requests per second for rates.

Definitions (the ones the serving study reports):

- **TTFT**: time from sending a request to receiving its first output token (client side, so it
  includes queueing in the engine).
- **TPOT**: time per output token *excluding the first token*: ``(t_last - t_first) / (n - 1)`` for a
  request of ``n`` output tokens; this is vLLM's own ``mean_time_per_output_token``.
- **ITL**: every gap between two consecutive output tokens of a request (``n - 1`` gaps per
  request); a distribution, not one number per request.
- **E2E**: send to last token.
- Percentiles use numpy's default linear interpolation between order statistics
  (``numpy.percentile(..., method="linear")``, Hyndman & Fan type 7).

Every statistic of a comparison (bootstrap and t intervals, paired A/B deltas, the noise floor of a configuration
against itself) lives in :mod:`fp8lab.stats`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

#: Percentiles reported for every latency metric.
PERCENTILES: tuple[int, ...] = (50, 95, 99)
#: Per-request latency columns of the engine records (seconds).
REQUEST_LATENCIES: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s")


# --------------------------------------------------------------------------------------------------
# Percentiles and per-class tables
# --------------------------------------------------------------------------------------------------


def _finite(values: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series)) else values, dtype=float)
    return a[np.isfinite(a)]


def percentiles(values: Iterable[float], qs: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """``{"n", "mean", "p50", "p95", "p99"}`` of the finite ``values`` (NaN/inf dropped; NaN when empty).

    >>> percentiles([1, 2, 3, 4])["p50"]
    2.5
    """
    a = _finite(values)
    out: dict[str, float] = {"n": int(a.size), "mean": float(a.mean()) if a.size else float("nan")}
    for q in qs:
        out[f"p{q:g}"] = float(np.percentile(a, q)) if a.size else float("nan")
    return out


def explode_itl(records: pd.DataFrame, keep: Sequence[str] = ()) -> pd.DataFrame:
    """One row per inter-token gap: the ``itl_s`` lists of ``records`` (one list per request, ``n - 1``
    gaps) exploded to a column ``itl_s``, with ``keep`` columns repeated and ``gap`` (0-based index)."""
    cols = [c for c in keep if c in records.columns]
    if "itl_s" not in records.columns or records.empty:
        return pd.DataFrame(columns=[*cols, "gap", "itl_s"])
    df = records[[*cols, "itl_s"]].copy()
    df["itl_s"] = df["itl_s"].map(lambda v: list(v) if v is not None and not isinstance(v, float) else [])
    df["gap"] = df["itl_s"].map(lambda v: list(range(len(v))))
    df = df.explode(["itl_s", "gap"], ignore_index=True).dropna(subset=["itl_s"])
    df["itl_s"] = df["itl_s"].astype(float)
    df["gap"] = df["gap"].astype(int)
    return df


def latency_table(
    records: pd.DataFrame,
    by: Sequence[str] = ("kv_dtype", "cls"),
    scale: float = 1e3,
    metrics: Sequence[str] = ("ttft_s", "tpot_s", "itl_s", "e2e_s"),
) -> pd.DataFrame:
    """Tidy table: one row per group of ``by`` and metric, columns ``n, mean, p50, p95, p99``.

    ``ttft_s``, ``tpot_s`` and ``e2e_s`` count one value per request; ``itl_s`` pools every gap of every
    request of the group. Values are multiplied by ``scale`` (1e3: milliseconds) and the metric is
    renamed accordingly (``ttft_ms`` ...).
    """
    by = [b for b in by if b in records.columns]
    unit = {1e3: "ms", 1.0: "s", 1e6: "us"}.get(scale, f"x{scale:g}")
    rows = []
    groups = records.groupby(by, sort=True, dropna=False) if by else [((), records)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            if m == "itl_s":
                vals = explode_itl(g)["itl_s"].to_numpy() if "itl_s" in g else np.array([])
            elif m in g:
                vals = g[m].to_numpy(dtype=float)
            else:
                continue
            st = percentiles(vals * scale)
            rows.append({**dict(zip(by, key, strict=True)), "metric": m.removesuffix("_s") + f"_{unit}", **st})
    return pd.DataFrame(rows)


def ecdf(values: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted finite values ``x`` and ``F(x) = i / n`` for ``i = 1..n``."""
    x = np.sort(_finite(values))
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


# --------------------------------------------------------------------------------------------------
# Throughput and rates
# --------------------------------------------------------------------------------------------------


def throughput(
    prompt_tokens: float, output_tokens: float, wall_s: float, requests: int | None = None
) -> dict[str, float]:
    """Tokens per second over a phase's wall time: ``input_tok_s`` (prompt tokens), ``output_tok_s``,
    ``total_tok_s`` (both), and ``requests_s`` when ``requests`` is given."""
    if not wall_s or wall_s <= 0:
        nan = float("nan")
        return {"input_tok_s": nan, "output_tok_s": nan, "total_tok_s": nan, "requests_s": nan}
    out = {
        "input_tok_s": prompt_tokens / wall_s,
        "output_tok_s": output_tokens / wall_s,
        "total_tok_s": (prompt_tokens + output_tokens) / wall_s,
    }
    if requests is not None:
        out["requests_s"] = requests / wall_s
    return out


def achieved_rate(sent_s: Iterable[float]) -> float:
    """Requests per second actually sent: ``(n - 1) / (last send - first send)`` (NaN for fewer than 2)."""
    t = np.sort(_finite(sent_s))
    if t.size < 2 or t[-1] <= t[0]:
        return float("nan")
    return float((t.size - 1) / (t[-1] - t[0]))


# --------------------------------------------------------------------------------------------------
# What the engine held at each decode step (for the roofline comparison)
# --------------------------------------------------------------------------------------------------


def decode_steps(records: pd.DataFrame) -> pd.DataFrame:
    """Per inter-token gap of ``records`` (one phase of one engine: columns ``sent_s``, ``ttft_s``,
    ``prompt_tokens``, ``itl_s``), estimate what the engine held when that token was produced.

    Token ``k`` of a request arrives at ``sent + ttft + sum(itl[:k])``. For each gap ending at time
    ``t``: ``batch`` = requests in flight at ``t`` (sent, last token not yet received) and
    ``kv_tokens`` = the sum over them of ``prompt_tokens + tokens received so far`` (the context the
    step had to read). Client-side timestamps, so approximate by one step. Returns columns
    ``request, itl_s, t_s, batch, kv_tokens, context``.
    """
    need = {"sent_s", "ttft_s", "prompt_tokens", "itl_s"}
    if records.empty or not need <= set(records.columns):
        return pd.DataFrame(columns=["request", "itl_s", "t_s", "batch", "kv_tokens", "context"])
    starts, ends, prompts, tok_times, tok_req = [], [], [], [], []
    gaps = []
    for i, r in enumerate(records.itertuples(index=False)):
        itl = np.asarray(list(r.itl_s) if r.itl_s is not None and not isinstance(r.itl_s, float) else [], dtype=float)
        if not np.isfinite(r.ttft_s):
            continue
        first = r.sent_s + r.ttft_s
        times = first + np.concatenate([[0.0], np.cumsum(itl)])
        starts.append(r.sent_s)
        ends.append(times[-1])
        prompts.append(r.prompt_tokens)
        tok_times.append(times)
        tok_req.append(np.full(times.size, i))
        for k in range(itl.size):
            gaps.append((i, itl[k], times[k + 1], r.prompt_tokens + k + 1))
    if not gaps:
        return pd.DataFrame(columns=["request", "itl_s", "t_s", "batch", "kv_tokens", "context"])
    start_a, end_a, prompt_a = np.asarray(starts), np.asarray(ends), np.asarray(prompts, dtype=float)
    all_tok = np.sort(np.concatenate(tok_times))
    order_s, order_e = np.argsort(start_a), np.argsort(end_a)
    s_sorted, e_sorted = start_a[order_s], end_a[order_e]
    cum_p_s = np.concatenate([[0.0], np.cumsum(prompt_a[order_s])])
    cum_p_e = np.concatenate([[0.0], np.cumsum(prompt_a[order_e])])
    ntok = np.asarray([t.size for t in tok_times], dtype=float)
    cum_n_e = np.concatenate([[0.0], np.cumsum(ntok[order_e])])
    g = np.asarray(gaps)
    t = g[:, 2]
    # a token that arrives at t belongs to the step that ends at t: count tokens received before t
    # (strictly) and requests that finished before t (strictly); the step's own token is excluded.
    started = np.searchsorted(s_sorted, t, side="right")
    finished = np.searchsorted(e_sorted, t, side="left")
    batch = started - finished
    tokens_before = np.searchsorted(all_tok, t, side="left")
    kv = (cum_p_s[started] - cum_p_e[finished]) + (tokens_before - cum_n_e[finished])
    return pd.DataFrame(
        {
            "request": g[:, 0].astype(int),
            "itl_s": g[:, 1],
            "t_s": t,
            "batch": batch.astype(int),
            "kv_tokens": kv,
            "context": g[:, 3],
        }
    )


__all__ = [
    "PERCENTILES",
    "REQUEST_LATENCIES",
    "achieved_rate",
    "decode_steps",
    "ecdf",
    "explode_itl",
    "latency_table",
    "percentiles",
    "throughput",
]
