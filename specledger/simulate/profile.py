"""The batched-step fit from a serving run (a measured :class:`~specledger.cost.costmodel.CostModel`).

The simulator prices steps with any :class:`specledger.cost.pricer.StepPricer` (measured, imported or
roofline, each labelled in every output by its ``source``); this module builds the measured one from a
serving run:

* a serving run's own steps (:func:`fit_serving_cost`): the batched engine writes one round record
  per request per step, and the rounds of one step share its packed forward's ``t_verify`` exactly,
  so grouping them rebuilds every step (rows R = sum(proposed + 1), batch B, mean context c). Fitted,
  with :mod:`specledger.cost.costmodel`'s non-negative parts:

    (every part a robust non-negative fit, :func:`robust_fit`)
      forward   T_s(R, B, c)   = the predict cost model's form (f0 + f_s [R>B] + f_r (R-B) + f_b (B-1) + ...)
      prefill   T_p(P, S)      = p0 + p1 P + p2 P^2 / 1000 + p3 P ln S, from every first admission's
                               ``t_prefill``; S = the server's sequence slots (its KV cache's batch
                               dimension). Measured here: the same prompt prefills 5-18 % slower into
                               a 16-slot cache than into a 1-slot one, whether the other slots are busy
                               or not (the first admissions of a burst cost what later ones do); the
                               term is fitted only when the run has two slot counts or more
      drafting  T_d(g, c)      per drafter, from the rounds' ``t_draft``
      overhead  T_o(B)         = o0 + o1 B: a step's wall time (between two emissions of a request that
                                 ran in both) minus its forward, drafting and the prefills it admitted
                                 (sampling, acceptance, stop checks, scheduling -- all of it)
      noise     each step's forward times a ratio drawn from the run's step-to-step jitter
                (:func:`local_noise_quantiles`), each prefill from its noise at a fixed prompt and slot
                count (:func:`noise_quantiles`); :meth:`CostModel.jitter`, used when asked

Cost files (a cost model, a serving fit, a surface, a roofline) are read by the one loader,
:func:`specledger.cost.loader.load_pricer`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.cost.costmodel import (
    FORWARD_TERMS,
    NOISE_QUANTILES,
    OVERHEAD_TERMS,
    PREFILL_TERMS,
    SLOT_TERM,
    CostModel,
    Part,
    draft_features,
    fit_part,
    forward_features,
    prefill_features,
    slot_prefill_features,
)
from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import require
from specledger.records import RequestRecord


def record_slots(r: RequestRecord) -> int | None:
    """The sequence slots of the server that served ``r`` (a serving sweep's record), if known."""
    e = r.extra
    s = e.get("slots") or (e.get("load") if e.get("kind") == "concurrency" else e.get("concurrency"))
    return int(s) if isinstance(s, (int, float)) and s >= 1 else None


def noise_quantiles(values: Sequence[float], keys: Sequence[Any], min_group: int = 5) -> list[float]:
    """101 quantiles of t / median(t of the same key) over keys seen >= ``min_group`` times: the
    machine's noise at fixed work (not the fit's misfit), clipped to its 1%..99% range (the rare
    seconds-long hiccups of a shared machine are not the machine's cost)."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for v, k in zip(values, keys):
        groups[k].append(float(v))
    r = np.concatenate([np.asarray(g) / np.median(g) for g in groups.values()
                        if len(g) >= min_group and np.median(g) > 0]
                       or [np.ones(0)])
    if r.size == 0:
        return []
    lo, hi = np.quantile(r, [0.01, 0.99])
    return np.quantile(np.clip(r, lo, hi), NOISE_QUANTILES).tolist()


def local_noise_quantiles(records: Sequence[RequestRecord], steps: Sequence[Step], forward: Part,
                          window: int = 3, min_rounds: int = 8) -> list[float]:
    """101 quantiles of the forward's step-to-step noise: along each request (>= ``min_rounds``
    rounds), x_k = t_k / T_s(step k) (measured over fitted) divided by the median of x over rounds
    k - window .. k + window. Dividing by the fit removes the work (rows, batch, context); dividing by
    the local median removes slow drift of the machine between points and repeats, which moves whole
    points (throughput) rather than single steps. What is left is the jitter that makes ITL tails."""
    by_step = {(s.key, s.t_forward): s for s in steps}
    out: list[np.ndarray] = []
    for r in records:
        point = _point(r)
        x = []
        for rd in r.rounds:
            st = by_step.get((point, rd.t_verify))
            fit = forward.value(forward_features(st.rows, st.batch, st.context)) if st is not None else 0.0
            if fit > 0:
                x.append(rd.t_verify / fit)
        if len(x) < min_rounds:
            continue
        xv = np.asarray(x)
        local = np.array([np.median(xv[max(0, k - window):k + window + 1]) for k in range(xv.size)])
        out.append(xv / local)
    if not out:
        return []
    return np.quantile(np.concatenate(out), NOISE_QUANTILES).tolist()


def robust_fit(terms: Sequence[str], rows: Sequence[dict[str, float]], y: Sequence[float], iterations: int = 8,
               k: float = 1.5) -> Part:
    """Non-negative fit with Huber weights (IRLS): w_i = min(1, k * s / |r_i|), s = 1.4826 * MAD of the
    residuals, each pass an NNLS fit of sqrt(w) * y on sqrt(w) * x (:func:`fit_part`). A busy machine
    puts a few steps seconds off; least squares would follow them, this fit follows the bulk."""
    terms = list(terms)
    if not rows:
        return Part(terms, [0.0] * len(terms))
    yv = np.asarray(y, dtype=float)
    x = np.array([[r[t] for t in terms] for r in rows], dtype=float)
    w = np.ones_like(yv)
    part = Part(terms, [0.0] * len(terms))
    for _ in range(iterations):
        sw = np.sqrt(w)
        part = fit_part(terms, [dict(zip(terms, row)) for row in x * sw[:, None]], yv * sw, n_boot=0)
        resid = yv - x @ np.asarray(part.coef)
        scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) or 1e-12
        w = np.minimum(1.0, k * scale / np.maximum(np.abs(resid), 1e-15))
    part.rms_s = float(np.sqrt(np.mean((yv - x @ np.asarray(part.coef)) ** 2)))
    part.n_obs = len(rows)
    return part


@dataclass
class Step:
    rows: int
    batch: int
    context: float
    t_forward: float
    t_draft: float
    prefill_s: float  # prefills of the requests admitted in this step
    wall: float | None  # emission-to-emission time of a request present in this and the previous step
    key: Any = None


def _point(r: RequestRecord) -> tuple:
    """The serving point (and repeat) a record was served in: its steps are those of that point."""
    e = r.extra
    return (e.get("kind"), e.get("load"), e.get("setting"), e.get("repeat", 0), e.get("source"), e.get("concurrency"))


def steps_from_records(records: Iterable[RequestRecord]) -> list[Step]:
    """Rebuild the batched engine's steps: rounds of one point and repeat that share ``t_verify``."""
    groups: dict[tuple, list[tuple[RequestRecord, int]]] = defaultdict(list)
    for r in records:
        point = _point(r)
        for i, rd in enumerate(r.rounds):
            groups[(point, rd.t_verify)].append((r, i))
    steps = []
    for key, members in groups.items():
        rds = [r.rounds[i] for r, i in members]
        walls = []
        for r, i in members:
            emits = _chunk_times(r)
            if i >= 1 and i + 1 < len(emits):
                walls.append(emits[i + 1] - emits[i])
        steps.append(Step(rows=sum(rd.proposed + 1 for rd in rds), batch=len(rds),
                          context=float(np.mean([rd.context_len for rd in rds])), t_forward=float(key[1]),
                          t_draft=float(sum(rd.t_draft for rd in rds)),
                          prefill_s=float(sum(r.t_prefill for r, i in members if i == 0)),
                          wall=float(np.median(walls)) if walls else None, key=key[0]))
    return steps


def _chunk_times(r: RequestRecord) -> list[float]:
    """Emission time of each chunk: the first is the prefill's token, chunk k >= 1 is round k - 1's."""
    out, pos = [], 0
    for n in r.chunks:
        if n <= 0 or pos >= len(r.token_times):
            continue
        out.append(r.token_times[pos])
        pos += n
    return out


def fit_serving_cost(records: Sequence[RequestRecord], source: str = "") -> CostModel:
    """Fit the measured :class:`~specledger.cost.costmodel.CostModel` of a serving run's batched steps
    (see the module docstring): the same type as a solo run's, with a per-step overhead and step noise."""
    records = [r for r in records if r.rounds]
    require(bool(records), "no serving rounds to fit step costs on; give a `sweep --experiment serving` run")
    steps = steps_from_records(records)
    forward = robust_fit(FORWARD_TERMS, [forward_features(s.rows, s.batch, s.context) for s in steps],
                         [s.t_forward for s in steps])
    pre = [(r, record_slots(r)) for r in records if r.t_prefill > 0]
    if len({s for _, s in pre if s is not None}) >= 2:
        pre = [(r, s) for r, s in pre if s is not None]
        prefill = robust_fit((*PREFILL_TERMS, SLOT_TERM), [slot_prefill_features(r.prompt_tokens, s) for r, s in pre],
                             [r.t_prefill for r, _ in pre])
    else:
        prefill = robust_fit(PREFILL_TERMS, [prefill_features(r.prompt_tokens) for r, _ in pre],
                             [r.t_prefill for r, _ in pre])
    draft: dict[str, Part] = {}
    for d in sorted({r.drafter for r in records} - {PLAIN.name}):
        xs, ys = [], []
        for r in records:
            if r.drafter != d:
                continue
            for rd in r.rounds:
                if rd.gamma > 0:
                    xs.append(draft_features(rd.gamma, rd.context_len))
                    ys.append(rd.t_draft)
        if xs:
            draft[d] = robust_fit(("1", "g", "ctx", "g_ctx"), xs, ys)
    walls = [s for s in steps if s.wall is not None]
    ov_y = [max(0.0, s.wall - s.t_forward - s.t_draft - s.prefill_s) for s in walls]  # type: ignore[operator]
    overhead = robust_fit(OVERHEAD_TERMS, [{"1": 1.0, "B": float(s.batch)} for s in walls], ov_y)
    f_ratio = local_noise_quantiles(records, steps, forward)
    p_ratio = noise_quantiles([r.t_prefill for r, _ in pre], [(r.prompt_tokens, s) for r, s in pre])
    return CostModel(source or f"fitted from {len(steps)} batched steps of a serving run", forward, prefill, draft,
                     meta={"steps": len(steps), "requests": len(records),
                           "forward_rms_ms": 1e3 * (forward.rms_s or math.nan)},
                     overhead=overhead, forward_ratios=f_ratio, prefill_ratios=p_ratio)


