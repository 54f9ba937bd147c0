"""What a load point is made of, shared by the main job, the probe, the simulated loads and the report:
the ``--loads`` list or range (:func:`parse_loads`), the order of a closed-loop point's requests (:func:`interleaved`,
:func:`requests_at`) and the open loop's seeded Poisson send times (:func:`poisson_arrivals`, the one
generator: the probe's send times and the simulator's arrivals, :func:`specledger.simulate.arrivals.poisson`,
are the same for the same seed). Pure functions of their arguments; nothing here runs a point."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from specledger.errors import SpecLedgerError, require


def is_load_range(text: str | None) -> bool:
    """Whether a ``--loads`` value is a range ``A..B`` (bisected: :mod:`specledger.load_bisect`), not a list."""
    return text is not None and ".." in text


def parse_loads(text: str | None, flag: str = "--loads", example: str = "1,4,16",
                allow_none: bool = False, allow_range: bool = False) -> list[int] | None:
    """``"1,4,16"`` -> [1, 4, 16] (sorted, distinct); ``"A..B"`` -> [A, B] (its ends, A < B) where
    ``allow_range``; ``"none"`` -> [] where ``allow_none``; anything else is a one-line error naming the fix."""
    if text is None:
        return None
    if allow_none and text.strip().lower() == "none":
        return []
    ranged = allow_range and is_load_range(text)
    try:
        values = [float(x) for x in text.split(".." if ranged else ",") if x.strip() or ranged]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v < 1 or v != int(v) for v in values) \
            or (ranged and (len(values) != 2 or values[0] >= values[1])):
        raise SpecLedgerError(f"{flag} {text!r}: give whole numbers of concurrent requests >= 1, "
                              f"e.g. {flag} {example}" + (" or a range to bisect, e.g. 1..16" if allow_range else "")
                              + (" (or none)" if allow_none else ""))
    return sorted({int(v) for v in values})


def interleaved(prompt_ids: Sequence[str], category: Mapping[str, str]) -> list[str]:
    """Round-robin over categories (first-seen order)."""
    by: dict[str, list[str]] = {}
    for pid in prompt_ids:
        by.setdefault(category[pid], []).append(pid)
    out: list[str] = []
    for i in range(max((len(v) for v in by.values()), default=0)):
        out += [v[i] for v in by.values() if i < len(v)]
    return out


def requests_at(load: int, prompt_ids: Sequence[str]) -> list[str]:
    """The requests of a closed-loop point at ``load``: max(load, prompts), the prompts cycled (none
    without prompts)."""
    n = len(prompt_ids)
    return [prompt_ids[i % n] for i in range(max(load, n))] if n else []


def poisson_arrivals(rate: float, count: int, seed: int | None) -> list[float]:
    """``count`` arrival offsets (s) of a Poisson process at ``rate`` req/s: cumulative Exp(1/rate) gaps
    drawn by numpy's ``default_rng(seed)``."""
    require(rate > 0 and math.isfinite(rate), f"rate must be a positive number of requests per second, got {rate}")
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=count)).tolist()


__all__ = ["interleaved", "is_load_range", "parse_loads", "poisson_arrivals", "requests_at"]
