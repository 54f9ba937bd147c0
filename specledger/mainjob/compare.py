"""A fair side-by-side of plain and speculative decoding of one prompt (``specledger generate``).

Cold runs lie: the first decode of a process pays kernel/primitive creation and cache growth,
so comparing a cold speculative run with a warm plain one reports a slow-down that is not there.
Here both sides are warmed up first (one short untimed decode each), then ``repeats`` pairs run
interleaved (plain, speculative; then speculative, plain; ...), and each pair gives two ratios:

    decode-only S = (Σ committed in rounds / Σ round time)_spec / (same)_plain     (prefill excluded)
    end-to-end  S = (output tokens / total time)_spec / (same)_plain               (prefill included)

reported as the median over pairs. A drafter that learns across requests (suffix) gets a fresh
instance for every run, so it cannot learn the answer from the previous repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specledger.engine.drafters.catalog import SUFFIX
from specledger.records import RequestRecord

if TYPE_CHECKING:
    from specledger.engine.protocol import TargetEngine

CROSS_REQUEST_DRAFTERS = frozenset({SUFFIX.name})


def decode_speed(r: RequestRecord) -> float:
    """Committed tokens of the rounds per second of rounds (prefill excluded)."""
    t = sum(rd.t_round for rd in r.rounds)
    return sum(rd.committed for rd in r.rounds) / t if t > 0 else float("nan")


def end_to_end_speed(r: RequestRecord) -> float:
    return r.output_tokens / r.total_time if r.total_time > 0 else float("nan")


@dataclass
class Comparison:
    plain: list[RequestRecord] = field(default_factory=list)
    spec: list[RequestRecord] = field(default_factory=list)

    def ratios(self, speed: Callable[[RequestRecord], float]) -> list[float]:
        return [speed(s) / speed(p) for s, p in zip(self.spec, self.plain) if speed(p) > 0]

    def summary(self) -> dict[str, Any]:
        dec, e2e = self.ratios(decode_speed), self.ratios(end_to_end_speed)
        return {
            "repeats": len(self.spec),
            "warmed_up": True,
            "decode_speedup": statistics.median(dec) if dec else None,
            "end_to_end_speedup": statistics.median(e2e) if e2e else None,
            "decode_speedups": dec,
            "end_to_end_speedups": e2e,
            "plain_tokens_per_s": statistics.median([end_to_end_speed(r) for r in self.plain]) if self.plain else None,
            "spec_tokens_per_s": statistics.median([end_to_end_speed(r) for r in self.spec]) if self.spec else None,
            "identical_to_plain": all(s.token_ids == p.token_ids for s, p in zip(self.spec, self.plain)),
        }


def compare_plain_spec(
    engine: TargetEngine,
    prompt_ids: Sequence[int],
    make: Callable[[], Any],
    drafter_name: str,
    gamma: int,
    kwargs: dict[str, Any],
    repeats: int = 2,
    warmup_tokens: int = 8,
    tree_budget: int = 0,
) -> Comparison:
    """Warm up both sides, then ``repeats`` interleaved (plain, speculative) pairs; ``make()`` builds a
    drafter (called per run for cross-request drafters, once otherwise)."""
    shared = None if drafter_name in CROSS_REQUEST_DRAFTERS else make()

    def drafter() -> Any:
        return make() if shared is None else shared

    warm = {**kwargs, "max_tokens": max(1, min(warmup_tokens, int(kwargs.get("max_tokens", warmup_tokens))))}
    engine.generate(prompt_ids, **warm)
    engine.generate(prompt_ids, drafter=drafter(), gamma=gamma, tree_budget=tree_budget, **warm)
    out = Comparison()
    for i in range(max(1, repeats)):
        order = ("plain", "spec") if i % 2 == 0 else ("spec", "plain")
        got: dict[str, RequestRecord] = {}
        for side in order:
            if side == "plain":
                got[side] = engine.generate(prompt_ids, **kwargs)
            else:
                got[side] = engine.generate(prompt_ids, drafter=drafter(), gamma=gamma, tree_budget=tree_budget,
                                            **kwargs)
        out.plain.append(got["plain"])
        out.spec.append(got["spec"])
    return out
