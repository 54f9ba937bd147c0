"""How requests arrive: a closed loop at concurrency c, Poisson at a rate, or a replay of measured send times.

Closed loop (the serving sweep's, vLLM bench's ``--max-concurrency``): c clients, each sends its
next request the moment its previous one finishes, so c requests are always in flight. Open loop:
arrival offsets fixed in advance -- Poisson (exponential gaps, mean 1/rate, seeded) or replayed
from a probe run's send times (``extra.start_s`` of each record) or a JSON list of offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specledger.errors import require
from specledger.load_points import poisson_arrivals
from specledger.rundir import TRACE_NAME, RunDir, read_json


@dataclass(frozen=True)
class Arrivals:
    """Exactly one of ``concurrency`` (closed loop) and ``times`` (open loop, sorted offsets in s)."""

    concurrency: int | None = None
    times: np.ndarray | None = None
    label: str = ""

    @property
    def closed(self) -> bool:
        return self.concurrency is not None


def closed_loop(concurrency: int) -> Arrivals:
    require(isinstance(concurrency, int) and concurrency >= 1,
            f"concurrency must be an integer >= 1, got {concurrency}")
    return Arrivals(concurrency=concurrency, label=f"concurrency={concurrency}")


def poisson(rate: float, count: int, seed: int = 0) -> Arrivals:
    """``count`` arrivals of a Poisson process at ``rate`` req/s: the probe's send times
    (:func:`specledger.load_points.poisson_arrivals`, the same for the same seed)."""
    return Arrivals(times=np.asarray(poisson_arrivals(rate, count, seed), dtype=float), label=f"rate={rate:g}")


def replay(offsets: np.ndarray | list[float], label: str = "replay") -> Arrivals:
    t = np.sort(np.asarray(offsets, dtype=float))
    require(t.size > 0 and bool(np.all(np.isfinite(t))), "a replay needs at least one finite arrival time")
    return Arrivals(times=t - t[0], label=label)


def replay_file(path: str | Path) -> Arrivals:
    """Send times from a probe run directory (its traces' ``extra.start_s``) or a JSON list of offsets (s)."""
    p = Path(path)
    if p.is_dir():
        run = RunDir(p)
        trace = run.trace_path
        require(trace.is_file(), f"{p} has no {TRACE_NAME}; give a probe run directory or a JSON list of offsets")
        starts = [r.extra["start_s"] for r in run.records_so_far() if "start_s" in r.extra]
        require(bool(starts), f"{trace} has no send times (extra.start_s); replay needs a probe run")
        return replay(starts, label=f"replay {p.name}")
    require(p.is_file(), f"replay file not found: {p}")
    data = read_json(p, "give a list of arrival offsets in seconds")
    require(isinstance(data, list) and all(isinstance(x, (int, float)) for x in data),
            f"{p} must hold a JSON list of arrival offsets in seconds")
    return replay(data, label=f"replay {p.name}")
