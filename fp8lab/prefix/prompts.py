"""Study 07's conversations as token ids (:func:`conversation_pool`): real text from ``data/text`` (a JSON-schema
template for the ``json`` workload) or seeded random ids for dummy weights, deterministic in (spec, shape, trial,
index). The worker (:mod:`fp8lab.prefix.worker`) sends them."""

from __future__ import annotations

import json
import random
from typing import Any

from fp8lab.prefix.spec import PrefixSpec, Shape


def _text_ids(spec: PrefixSpec, length: int, offset: int) -> list[int]:
    from fp8lab.workloads import document_ids

    return list(document_ids(spec.model, length, offset)) if length else []


def _random_ids(spec: PrefixSpec, length: int, seed: int) -> list[int]:
    from fp8lab.workloads import model_vocab_size, random_ids

    return list(random_ids(model_vocab_size(spec.engine_spec("auto").model), length, seed)) if length else []


def _exact(ids: list[int], length: int, filler: list[int]) -> list[int]:
    out = (ids + filler)[:length]
    return out + filler[: length - len(out)] if len(out) < length else out


def _template_text(seed: int) -> str:
    """A JSON-schema-like extraction template (instructions + schema), seeded."""
    from fp8lab.workloads import json_object

    rng = random.Random(seed)
    example = json.loads(json_object(rng))
    props = {
        k: {
            "type": type(v)
            .__name__.replace("str", "string")
            .replace("int", "integer")
            .replace("float", "number")
            .replace("bool", "boolean")
            .replace("list", "array")
            .replace("dict", "object")
        }
        for k, v in example.items()
    }
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": props,
        "required": sorted(props),
    }
    return (
        "You extract records. Answer with one JSON object that validates against this schema, nothing else.\n"
        + json.dumps(schema, indent=2)
        + "\nExample:\n"
        + json.dumps(example, indent=2)
        + "\n"
    )


def conversation_pool(spec: PrefixSpec, shape: Shape, trial: int, n: int) -> list[dict[str, Any]]:
    """The first ``n`` conversations of a workload in a trial: ``shared`` (the same for every conversation and
    trial), ``private`` and ``users`` (one message per turn), token ids. ``trial = spec.trials`` (one past the
    last) gives the correctness check's conversations. Deterministic in (spec, shape, trial, index)."""
    k = ("chat", "system", "json").index(shape.kind)
    per_conv = shape.private + shape.turns * shape.user
    base_off = 50_000 * k + 7_919 * trial * max(n, 1)
    if spec.prompt_source == "random":
        shared = _random_ids(spec, shape.shared, spec.seed * 1_000 + k)
        pool = []
        for i in range(n):
            s = spec.seed * 1_000_003 + k * 100_003 + trial * 10_007 + i
            ids = _random_ids(spec, per_conv, s)
            pool.append(
                {
                    "shared": shared,
                    "private": ids[: shape.private],
                    "users": [
                        ids[shape.private + t * shape.user : shape.private + (t + 1) * shape.user]
                        for t in range(shape.turns)
                    ],
                }
            )
        return pool
    from fp8lab.workloads import json_object, load_tokenizer

    filler = _text_ids(spec, max(shape.shared, shape.private, 1), 400_000 + 1_000 * k)
    tok = load_tokenizer(spec.engine_spec("auto").model)
    if shape.kind == "json":
        shared = _exact(tok.encode(_template_text(spec.seed), add_special_tokens=False), shape.shared, filler)
    else:
        shared = _text_ids(spec, shape.shared, 300_000 + 1_000 * k)
    pool = []
    for i in range(n):
        off = base_off + i * (per_conv + 31)
        if shape.kind == "json":
            rng = random.Random(spec.seed * 1_000_003 + trial * 10_007 + i)
            rec = "Record:\n" + "\n".join(json_object(rng) for _ in range(8))
            private = _exact(tok.encode(rec, add_special_tokens=False), shape.private, filler)
            ask = [
                _exact(
                    tok.encode(f"\nExtract record {j + 1} as JSON.\n", add_special_tokens=False),
                    shape.user,
                    _text_ids(spec, shape.user, off + j * shape.user),
                )
                for j in range(shape.turns)
            ]
        else:
            private = _text_ids(spec, shape.private, off)
            ask = [_text_ids(spec, shape.user, off + shape.private + j * shape.user) for j in range(shape.turns)]
        pool.append({"shared": shared, "private": private, "users": ask})
    return pool
