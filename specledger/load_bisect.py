"""Where along the load axis the answer changes: ``--loads A..B`` measures both ends, then bisects in powers of
two wherever the decision (or S against 1) changes between adjacent measured loads, until the adjacent
measured loads around each change differ by at most 2× (``1..16``: measure 1 and 16; if they differ, 4; then
2 or 8; ...). One planner for ``specledger run`` and ``specledger probe``: pure functions of the loads measured
so far and what each decided (any hashable key, equal where nothing changed); nothing here measures.

- :func:`next_load`: the next load to measure, or None when every change is bracketed within 2×;
- :func:`brackets`: the changes, each as the pair of adjacent measured loads around it;
- :func:`locate`: the loop (measure, read the keys, ask :func:`next_load`) for a caller that measures one load
  at a time, with a hook that says whether the next point is affordable;
- :func:`point_cost`: a load point's time, interpolated from the points measured (for that hook).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

#: adjacent measured loads around a change are close enough when the larger is at most this times the smaller
BRACKET_RATIO = 2


def brackets(keys: Mapping[int, Hashable]) -> list[tuple[int, int]]:
    """Every pair of adjacent measured loads (a, b), a < b, whose keys differ: where the answer changes."""
    loads = sorted(keys)
    return [(a, b) for a, b in zip(loads, loads[1:]) if keys[a] != keys[b]]


def is_located(a: int, b: int) -> bool:
    """A change between measured loads a < b is located when b <= 2·a (:data:`BRACKET_RATIO`)."""
    return b <= BRACKET_RATIO * a


def power_between(a: int, b: int) -> int | None:
    """The power of two strictly between a and b nearest the bracket's midpoint in log scale (√(a·b); a tie
    goes to the smaller); None when there is none (never when b > 2·a >= 2: (a, 2a] holds one)."""
    if b - a < 2:
        return None
    mid = (math.log2(a) + math.log2(b)) / 2 if a >= 1 else math.log2(b) / 2
    inside = [1 << e for e in range(0, b.bit_length() + 1) if a < (1 << e) < b]
    return min(inside, key=lambda p: (abs(math.log2(p) - mid), p)) if inside else None


def next_load(keys: Mapping[int, Hashable]) -> int | None:
    """The next load to measure: in the widest bracket still wider than 2× (largest b/a; a tie goes to the
    lower loads), the power of two nearest its log midpoint (:func:`power_between`); None when every change
    lies between adjacent measured loads at most 2× apart (or there is no change)."""
    open_ = [(a, b) for a, b in brackets(keys) if not is_located(a, b) and power_between(a, b) is not None]
    if not open_:
        return None
    a, b = min(open_, key=lambda ab: (-ab[1] / ab[0], ab[0]))
    return power_between(a, b)


def range_loads(lo: int, hi: int, extra: Sequence[int] = ()) -> list[int]:
    """The loads a range ``lo..hi`` measures before bisecting: both ends (and ``extra`` loads inside it, e.g. the
    SLO's target load), sorted, distinct."""
    return sorted({int(lo), int(hi), *(int(x) for x in extra if lo <= int(x) <= hi)})


def locate(initial: Sequence[int], measure: Callable[[int], None], keys: Callable[[], Mapping[int, Hashable]],
           afford: Callable[[int], bool] | None = None, max_points: int = 32) -> list[int]:
    """Measure every load of ``initial``, then each :func:`next_load` of ``keys()`` (read after every point)
    while ``afford(load)`` allows it (at most ``max_points`` loads in all); returns the loads measured, in
    order. ``measure`` may skip a load already measured (a resumed run)."""
    done: list[int] = []
    for load in sorted(set(initial)):
        measure(load)
        done.append(load)
    while len(done) < max_points and (load := next_load(keys())) is not None and load not in done:
        if afford is not None and not afford(load):
            break
        measure(load)
        done.append(load)
    return done


def point_cost(load: int, costs: Mapping[int, float]) -> float | None:
    """A load point's time (s) estimated from the points measured (``{load: seconds}``): log-log interpolation
    between the measured loads around ``load``; below every measured load, the nearest one's time scaled up by
    √(ratio of loads) (fewer requests in flight batch less, so the same requests take longer); above every
    measured load, the nearest one's time. None without any measured point."""
    known = {int(x): float(c) for x, c in costs.items() if c is not None and c > 0}
    if not known:
        return None
    if load in known:
        return known[load]
    below = [x for x in known if x < load]
    above = [x for x in known if x > load]
    if below and above:
        a, b = max(below), min(above)
        w = (math.log(load) - math.log(a)) / (math.log(b) - math.log(a))
        return math.exp((1 - w) * math.log(known[a]) + w * math.log(known[b]))
    if above:
        b = min(above)
        return known[b] * math.sqrt(b / load)
    return known[max(below)]


__all__ = ["BRACKET_RATIO", "brackets", "is_located", "locate", "next_load", "point_cost", "power_between",
           "range_loads"]
