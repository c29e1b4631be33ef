"""Engine-level replication: which fresh engines a study starts, in which order (pure; no vLLM).

An A/B study that starts one engine per configuration and repeats inside it measures that one engine: engine
start-up (memory placement, CUDA-graph capture, the allocator's layout) varies from engine to engine, so its
repetitions are pseudo-replicates and an interval over them describes the engine, not a deployment. Here each
configuration is started ``rounds`` times, fresh, in ABBA order so that a linear drift of the machine hits A and
B alike, and each round's engines are the pair an analysis compares (the engine is the experimental unit; the
repetitions inside an engine are averaged first).

Two arms (:data:`ARMS`):

- ``colocated``: the round's engines (one per configuration) are alive together and measured in turn, as two
  engines sharing one device (today's layout of Studies 01, 06, 07); start order alternates AB, BA, AB...
- ``solo``: one engine at a time (what a user deploys), the round's engines one after the other; over the rounds
  the starts read A B, B A, A B... = ABBAAB.

Rounds interleave the arms (round 0: colocated then solo; round 1: solo then colocated; ...), so a round's two
arms are adjacent in time and a between-arm difference can be paired by round. :func:`abba_schedule` builds the
list; :class:`EngineSet` is one entry (the engines alive together). Study 06 runs it
(:mod:`fp8lab.decode.worker`); the serving and prefix studies can run the same list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The arms: engines of a round alive together (``colocated``) or one engine at a time (``solo``).
ARMS: tuple[str, ...] = ("colocated", "solo")


@dataclass(frozen=True)
class EngineSet:
    """Engines alive at the same time: ``arm``, ``round`` (0-based) and the configurations in start order."""

    arm: str
    round: int
    configs: tuple[str, ...]

    @property
    def key(self) -> str:
        """``<arm>/r<round>`` for a co-located set, ``<arm>/r<round>/<config>`` for a one-engine set."""
        base = f"{self.arm}/r{self.round}"
        return base if len(self.configs) > 1 else f"{base}/{self.configs[0]}"

    def engine_id(self, config: str) -> str:
        """The engine's stable name: ``<arm>/r<round>/<config>`` (the same across resumed attempts)."""
        return f"{self.arm}/r{self.round}/{config}"

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "round": self.round, "configs": list(self.configs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSet:
        return cls(str(d["arm"]), int(d["round"]), tuple(d["configs"]))


def abba_schedule(
    configs: Sequence[str], rounds: int, arms: Sequence[str] = ARMS, colocate: bool = True
) -> list[EngineSet]:
    """The engine sets of ``rounds`` rounds, in the order they run.

    Round ``r`` starts the configurations in order (``r`` even) or reversed (``r`` odd) and runs the arms in order
    (``r`` even) or reversed. ``colocated`` gives one set holding every configuration (``colocate=False``: one set
    per configuration, one after the other, for models too large for two engines); ``solo`` one set per
    configuration.

    >>> [s.key for s in abba_schedule(["A", "B"], 2, ["solo"])]
    ['solo/r0/A', 'solo/r0/B', 'solo/r1/B', 'solo/r1/A']
    >>> [s.key for s in abba_schedule(["A", "B"], 2)]
    ['colocated/r0', 'solo/r0/A', 'solo/r0/B', 'solo/r1/B', 'solo/r1/A', 'colocated/r1']
    """
    configs, arms = tuple(configs), tuple(arms)
    if not configs or len(set(configs)) != len(configs):
        raise ValueError(f"abba_schedule: configs {configs!r} must be distinct and at least one")
    if not arms or any(a not in ARMS for a in arms) or len(set(arms)) != len(arms):
        raise ValueError(f"abba_schedule: arms {arms!r} must be distinct values of {ARMS}")
    if rounds < 1:
        raise ValueError(f"abba_schedule: rounds {rounds} must be at least 1")
    out: list[EngineSet] = []
    for r in range(rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        for arm in arms if r % 2 == 0 else arms[::-1]:
            if arm == "colocated" and colocate:
                out.append(EngineSet(arm, r, order))
            else:
                out.extend(EngineSet(arm, r, (c,)) for c in order)
    return out


def start_order(schedule: Sequence[EngineSet], arm: str) -> list[str]:
    """The configurations of ``arm``'s engines in the order they start (``ABBAAB...`` for two)."""
    return [c for s in schedule if s.arm == arm for c in s.configs]
