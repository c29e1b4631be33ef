"""Running Study 02's captures: :func:`calibrate` (each prompt cut and the large set, through the results store) ->
:class:`Calibration`; :func:`quality_scale_sets` (the sets measured end to end)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from fp8lab.calibration.capture import AmaxCapture, stored_capture
from fp8lab.calibration.pool import CalibrationPool, calibration_pool, draw_samples, prompt_ids
from fp8lab.calibration.scales import ScaleSet, build_scale_sets, scale_set_from_capture
from fp8lab.calibration.spec import REFERENCE, CalibrationSpec


@dataclass
class Calibration:
    """The captures of one study: ``captures`` ``{source name: AmaxCapture}`` (the prompt cuts and
    ``large``), the ``pool`` the large set was drawn from and its ``samples`` (token ids)."""

    spec: CalibrationSpec
    captures: dict[str, AmaxCapture]
    pool: CalibrationPool
    samples: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def large(self) -> AmaxCapture:
        return self.captures[REFERENCE]

    def timing_table(self) -> pd.DataFrame:
        """One row per calibration source: samples, tokens, model load, calibration (capture + amax)
        seconds and tokens per second of calibration."""
        rows = []
        for name, c in self.captures.items():
            rows.append(
                {
                    "source": name,
                    "n_samples": c.n_samples,
                    "n_tokens": c.n_tokens,
                    "load_s": c.load_s,
                    "calib_s": c.capture_s,
                    "calib_cpu_s": c.cpu_s,
                    "tokens_per_s": c.n_tokens / c.capture_s if c.capture_s else float("nan"),
                    "device": c.device,
                    "threads": c.threads,
                }
            )
        return pd.DataFrame(rows)

    def scale_sets(self) -> list[ScaleSet]:
        """(a) each prompt cut, (b) the large set, x formats x strategies; (c) vLLM's dynamic formula
        emulated on the first prompt cut (one forward pass: the reports' prompt); (d) default 1.0."""
        first = self.spec.prompt_name(self.spec.prompt_tokens[0])
        return build_scale_sets(self.captures, self.spec.formats, self.spec.strategies, dynamic_from=first)


def calibrate(
    spec: CalibrationSpec, exclude_texts: Sequence[str] = (), reserve_tokens: int = 0, progress: bool = True
) -> Calibration:
    """Capture amax for each prompt cut (a) and for the large set (b), timing each; a capture already in the results
    store is loaded with the timings it had (:func:`stored_capture`).

    ``exclude_texts``/``reserve_tokens``: what the calibration pool leaves out (:func:`calibration_pool`;
    pass Study 03's prompt texts and :func:`quality_reserved_tokens`)."""
    pool = calibration_pool(spec.tokenizer, exclude_texts, reserve_tokens, spec.calib_roles)
    samples = draw_samples(pool, spec.calib_samples, spec.sample_tokens, spec.seed)
    captures: dict[str, AmaxCapture] = {}
    for n in spec.prompt_tokens:
        ids = prompt_ids(spec.tokenizer, n, spec.calib_prompt)
        captures[spec.prompt_name(n)] = stored_capture(
            spec.model, [ids], batch_size=1, device=spec.capture_device, threads=spec.capture_threads
        )
        if progress:
            c = captures[spec.prompt_name(n)]
            print(
                f"[{spec.prompt_name(n)}] {c.n_tokens} tokens in {c.capture_s:.3f} s (+{c.load_s:.1f} s load)",
                flush=True,
            )
    captures[REFERENCE] = stored_capture(
        spec.model, samples, batch_size=spec.capture_batch, device=spec.capture_device, threads=spec.capture_threads
    )
    if progress:
        c = captures[REFERENCE]
        print(
            f"[{REFERENCE}] {c.n_samples} samples, {c.n_tokens} tokens in {c.capture_s:.1f} s (+{c.load_s:.1f} s load)",
            flush=True,
        )
    return Calibration(spec, captures, pool, samples)


def quality_scale_sets(cal: Calibration) -> tuple[list[ScaleSet], ScaleSet | None]:
    """The E4M3 sets measured end to end (``quality_sets`` with ``quality_strategy``) and, when
    ``detect_head_reduction`` and the strategy is ``attn_head``, the reduced twin of the last of
    them (the reference set when it is measured), for :func:`head_reduction_check`."""
    s = cal.spec
    chosen = []
    for name in s.quality_sets:
        chosen.append(
            scale_set_from_capture(
                name, cal.captures[name], "e4m3", s.quality_strategy, source=f"{cal.captures[name].n_tokens} tokens"
            )
        )
    twin = None
    if s.detect_head_reduction and s.quality_strategy == "attn_head" and chosen:
        twin = chosen[-1].reduced()
    return chosen, twin
