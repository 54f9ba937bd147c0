"""The engine's measured step cost: the model's packed forward timed at a ladder of row counts.

:func:`calibrate_step_cost` times the model's packed forward at a ladder of row counts spread over
several sequence slots, median of repeats after one untimed warm-up per row count, and reads them as a
measured surface -- isotonic in rows, monotone and labelled beyond the ladder -- through
:meth:`specledger.cost.step_cost.StepCost.from_points` (the torch-free step cost a batched goodput policy
plans with, which the simulator prices with its own cost). :func:`step_cost_for` measures once per model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specledger.cost.step_cost import StepCost

if TYPE_CHECKING:
    from specledger.engine.model import Transformer

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192)


def _spread(rows: int, slots: int, start: int) -> tuple[list[int], list[int]]:
    """``rows`` packed rows over ``min(rows, slots)`` slots, each slot's rows at consecutive positions."""
    used = min(rows, slots)
    slot_ids, positions = [], []
    for s in range(used):
        n = rows // used + (1 if s < rows % used else 0)
        slot_ids += [s] * n
        positions += list(range(start, start + n))
    return slot_ids, positions


def calibrate_step_cost(model: Transformer, rows: Sequence[int] = DEFAULT_ROWS, context: int = 128, slots: int = 16,
                        repeats: int = 3) -> StepCost:
    """Time ``model.forward_packed`` at each row count (rows spread over up to ``slots`` sequences,
    each at ``context`` tokens of history): one untimed warm-up, then the median of ``repeats``."""
    per_slot = max(rows) // min(max(rows), slots) + 1
    cap = min(model.config.max_seq_len, context + per_slot + 8)
    start = max(0, min(context, cap - per_slot - 1))
    cache = model.new_cache(cap, batch_size=min(slots, max(rows)))
    times = []
    with torch.inference_mode():
        for r in rows:
            slot_ids, positions = _spread(r, slots, start)
            tokens = [(7 * i + 3) % model.config.vocab_size for i in range(r)]
            model.forward_packed(tokens, slot_ids, positions, cache)  # warm-up: kernels for this M
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model.forward_packed(tokens, slot_ids, positions, cache)
                samples.append(time.perf_counter() - t0)
            times.append(statistics.median(samples))
    return StepCost.from_points(rows, times, f"packed forwards of {type(model).__name__} over up to {slots} slots "
                                f"at context {context}, median of {repeats}", context=start)


_CACHE: dict[int, StepCost] = {}


def step_cost_for(model: Transformer) -> StepCost:
    """The calibrated cost of ``model`` (measured once per process and model object)."""
    key = id(model)
    if key not in _CACHE:
        _CACHE[key] = calibrate_step_cost(model)
    return _CACHE[key]


__all__ = ["DEFAULT_ROWS", "calibrate_step_cost", "step_cost_for"]
