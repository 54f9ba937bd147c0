"""What a replica's step costs: the one place the simulator turns a step into seconds.

Every way of taking steps prices them here, through the replica's pricer
(:class:`specledger.cost.pricer.StepPricer`): the step path, the scalar fast path and the array segments.
A step that starts at ``t`` ends at

    t + sum_i draft_s(gamma_i, C) + step_s(max(R, B), B, C) x noise + other_s(B)

(a left-to-right sum: :meth:`StepPrices.end_of_step`), with R the step's rows, B its batch, C the mean
context and ``noise`` the profile's forward multiplier for this replica's step (keyed on (replica, step
number): :func:`specledger.simulate.chains.keyed_stream`). A speculative step also adds its forward to the
replica's ``verify_s`` and step_s(max(R - sum P, B), B, C) x noise to its ``verify_base_s``. The scalar
forms (:meth:`StepPrices.forward`, :meth:`StepPrices.draft_total`) and the vectorised ones
(:func:`step_costs`, :func:`draft_costs`) give the same floats: a sum over requests is numpy's pairwise
sum (:func:`pairwise_sum`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from specledger.cost.pricer import step_s_each
from specledger.cost.roofline import DRAFT_MODEL_DRAFTERS, RooflineCost
from specledger.engine.drafters.catalog import PLAIN
from specledger.simulate.chains import STREAM_PREFILL_JITTER, STREAM_STEP_JITTER, keyed_stream


def pairwise_sum(v: list[float]) -> float:
    """numpy's float64 sum of ``v`` to the last bit: left to right below 8 terms, numpy's own above."""
    if len(v) < 8:
        r = 0.0
        for x in v:
            r += x
        return r
    return float(np.array(v).sum())


def scalar_step(cost: Any) -> Callable[[int, int, float], float]:
    """``cost.step_s`` as a plain function; for a roofline, :meth:`RooflineTerms.time` of the target with
    the roofline's clamps (same operations, same order: the same float)."""
    if type(cost) is not RooflineCost:
        return cost.step_s
    time = cost.terms().time

    def step_s(total_rows: int, batch: int, context: float) -> float:
        return time(max(1, total_rows), max(1, batch), max(0.0, context))

    return step_s


def step_fns(cost: Any) -> tuple[Callable[[int, int, float], float],
                                 Callable[[int, int, int, float], tuple[float, float]]]:
    """``(one, two)``: ``one(rows, batch, context)`` is :meth:`StepPrices.forward` (``cost.step_s(max(rows,
    batch), batch, context)``), ``two(rows, base, batch, context)`` the pair ``(one(rows, ..), one(base, ..))``.
    A roofline's are its fused :meth:`RooflineTerms.step_fns`; any other pricer's call ``step_s``. The same
    floats either way."""
    if type(cost) is RooflineCost:
        return cost.terms().step_fns()
    step_s = cost.step_s

    def one(rows: int, batch: int, context: float) -> float:
        return float(step_s(rows if rows > batch else batch, batch, context))

    def two(rows: int, base: int, batch: int, context: float) -> tuple[float, float]:
        return one(rows, batch, context), one(base, batch, context)

    return one, two


def step_costs(cost: Any, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
    """``cost.step_s(rows_s, batch, context_s)`` for every s: the cost's own ``step_s_many`` when it has
    one (the same floats), else one call per step."""
    many = getattr(cost, "step_s_many", None)
    if many is not None:
        return np.asarray(many(rows, batch, context), dtype=np.float64)
    return step_s_each(cost, rows, batch, context)


def flat_draft_price(cost: Any, drafter: str) -> float | None:
    """A roofline's price of one round of a model-free drafter (the same whatever gamma and context); None
    where drafting is priced per gamma and context."""
    if type(cost) is RooflineCost and not (cost.draft_model is not None and drafter in DRAFT_MODEL_DRAFTERS):
        return cost.model_free_draft_s
    return None


def draft_costs(cost: Any, drafter: str, gammas: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Drafting time of every request in every step: ``draft_s(drafter, gamma[s, i], context[s])``
    where gamma > 0, else 0 (shape of ``gammas``: steps x requests)."""
    out = np.zeros(gammas.shape)
    flat = flat_draft_price(cost, drafter)
    if flat is not None:
        out[gammas > 0] = flat
        return out
    ctx = context.tolist()
    for s in range(gammas.shape[0]):
        row = gammas[s]
        for gv in np.unique(row[row > 0]).tolist():
            out[s, row == gv] = float(cost.draft_s(drafter, int(gv), ctx[s]))
    return out


STEP_CACHE_MAX = 1 << 20  # step prices kept (StepPrices.step_cache) before the cache starts afresh


class StepPrices:
    """One replica's prices, read off its pricer ``cost`` (with caches of what does not change), and its
    speculative steps' verify seconds."""

    def __init__(self, cost: Any, drafter: str, slots: int, replica: int, seed: int, jitter: bool = True) -> None:
        self.cost, self.drafter, self.replica, self.seed = cost, drafter, replica, seed
        self.drafting = drafter != PLAIN.name
        self.forward_s = scalar_step(cost)  # (rows, batch, context) -> seconds, clamps included
        # forward(rows, batch, context) and (forward(rows, ..), forward(base, ..)) as plain functions (the same floats)
        self.forward_one, self.forward_two = step_fns(cost)
        # a fitted profile whose prefill depends on the server's slot count (CostModel.slot_dependent_prefill)
        self._slots_kw = {"slots": slots} if getattr(cost, "slot_dependent_prefill", False) else {}
        # a measured profile's step-time noise (u -> (forward, prefill) multipliers), if it carries one
        noise = getattr(cost, "jitter", None) if getattr(cost, "has_noise", True) else None
        self.noise: Callable[[float], tuple[float, float]] | None = noise if noise is not None and jitter else None
        self.flat_draft = flat_draft_price(cost, drafter) if self.drafting else None
        # flat_sums[n]: the left-to-right sum of n flat draft prices, n = 0..7 (draft_total of n < 8 drafting)
        self.flat_sums = [0.0]
        for _ in range(7):
            self.flat_sums.append(self.flat_sums[-1] + (self.flat_draft or 0.0))
        # numpy's sum of n of them (n decoding requests)
        self._flat_full: dict[int, float] = {}
        self._other: dict[int, float] = {}
        # a fast path's noiseless step prices: (rows, candidates, batch, context sum) -> (forward, forward
        # without the candidates (0.0 with none), other) -- functions of the key (the mean context is sum / batch)
        self.step_cache: dict[tuple[int, int, int, int], tuple[float, float, float]] = {}
        self._prefill: dict[int, float] = {}
        self.verify_s = 0.0  # its speculative steps' forward seconds (SimCounters.verify_s: the replicas' total)
        self.verify_base_s = 0.0  # and theirs without the candidate rows
        self.last_forward_s = 0.0  # the latest step's forward (noise applied): what a per-request policy is told

    # -- the parts ---------------------------------------------------------------------------
    def forward(self, rows: int, batch: int, context: float) -> float:
        """The target forward over ``rows`` rows (at least one per request) of ``batch`` requests."""
        return float(self.forward_s(rows if rows > batch else batch, batch, context))

    def forwards(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        """:meth:`forward` of many steps of one batch size (the same floats)."""
        return step_costs(self.cost, np.maximum(rows, batch), batch, context)

    def other(self, batch: int) -> float:
        s = self._other.get(batch)
        if s is None:
            s = self._other[batch] = float(self.cost.other_s(batch))
        return s

    def draft_each(self, gammas: np.ndarray, context: float) -> np.ndarray:
        """Each decoding request's drafting time at ``gammas`` (0 where gamma is 0)."""
        out = np.zeros(gammas.shape[0])
        if gammas.shape[0] and self.drafting and gammas.max() > 0:
            counts = np.bincount(gammas)
            for gv in np.flatnonzero(counts[1:]) + 1:
                out[gammas == gv] = float(self.cost.draft_s(self.drafter, int(gv), context))
        return out

    def draft_total(self, decoding: int, drafting: int, gammas: list[int], prefilling: list[int],
                    context: float) -> float:
        """``float(draft_each(g).sum())`` of the step's ``decoding`` requests, ``drafting`` of which ask gamma > 0
        (``gammas``: every running request's, those with ``prefilling`` > 0 not decoding)."""
        if not drafting or not self.drafting:
            return 0.0
        flat = self.flat_draft
        if flat is not None and decoding < 8:
            return self.flat_sums[drafting]
        if flat is not None and drafting == decoding:  # every decoding request drafts: one price, n times
            s = self._flat_full.get(decoding)
            if s is None:
                s = self._flat_full[decoding] = pairwise_sum([flat] * decoding)
            return s
        gs = [g for g, p in zip(gammas, prefilling) if not p]
        if flat is not None:
            return pairwise_sum([flat if g > 0 else 0.0 for g in gs])
        price: dict[int, float] = {}
        for g in gs:
            if g > 0 and g not in price:
                price[g] = float(self.cost.draft_s(self.drafter, g, context))
        return pairwise_sum([price[g] if g > 0 else 0.0 for g in gs])

    def drafts(self, gammas: np.ndarray, context: np.ndarray) -> np.ndarray:
        """:func:`draft_costs` of this replica's drafter (steps x requests)."""
        return draft_costs(self.cost, self.drafter, gammas, context)

    def prefill(self, tokens: int, request: int, admission: int) -> float:
        """Prefill of ``tokens`` tokens, times the profile's prefill noise keyed on (request, admission number)."""
        s = self._prefill.get(tokens)
        if s is None:
            s = self._prefill[tokens] = float(self.cost.prefill_s(int(tokens), **self._slots_kw))
        if self.noise is None:
            return s
        u = keyed_stream(self.seed, STREAM_PREFILL_JITTER, np.array([request]), np.array([admission]))
        return s * self.noise(float(u[0]))[1]

    def forward_noise(self, first_step: int, n: int) -> list[float] | None:
        """Forward multipliers of this replica's steps ``first_step`` .. ``first_step + n - 1``; None without noise."""
        if self.noise is None:
            return None
        u = keyed_stream(self.seed, STREAM_STEP_JITTER, np.full(n, self.replica),
                         np.arange(first_step, first_step + n))
        return [self.noise(x)[0] for x in u.tolist()]

    # -- the step ----------------------------------------------------------------------------
    def end_of_step(self, start: float, draft_s: float, forward_s: float, base_s: float | None,
                    noise: float | None, batch: int) -> float:
        """When a step that starts at ``start`` ends: drafting, the forward (times the step's ``noise``), then
        the per-step rest. A speculative step (``base_s``: its forward without the candidate rows, else None)
        adds its forward to ``verify_s`` and its base to ``verify_base_s``, noise applied to both."""
        f = self.last_forward_s = forward_s * noise if noise is not None else forward_s
        if base_s is not None:
            self.verify_s += f
            self.verify_base_s += base_s * noise if noise is not None else base_s
        return start + draft_s + f + self.other(batch)

    def step_prices(self, rows: int, candidates: int, batch: int, context_sum: int) -> tuple[float, float, float]:
        """(forward, forward without the ``candidates`` rows (0.0 with none), per-step rest) of a step of
        ``rows`` rows, noiseless: functions of the key alone (the mean context is ``context_sum`` / ``batch``),
        kept in :attr:`step_cache` (afresh past STEP_CACHE_MAX)."""
        key = (rows, candidates, batch, context_sum)
        pr = self.step_cache.get(key)
        if pr is None:
            if len(self.step_cache) >= STEP_CACHE_MAX:
                self.step_cache.clear()
            ctx = context_sum / batch
            f, fb = (self.forward_two(rows, rows - candidates, batch, ctx) if candidates
                     else (self.forward_one(rows, batch, ctx), 0.0))
            pr = self.step_cache[key] = (f, fb, self.other(batch))
        return pr

    def price_step(self, start: float, draft_s: float, rows: int, candidates: int, batch: int, context_sum: int,
                   noise: float | None) -> float:
        """When a step of ``rows`` rows (``candidates`` of them proposed tokens, ``batch`` requests of
        ``context_sum`` tokens of context) that starts at ``start`` ends: :meth:`end_of_step` of its
        :meth:`step_prices` (the one pricing of the step path and the scalar fast path)."""
        f, fb, ot = self.step_prices(rows, candidates, batch, context_sum)
        if noise is not None:
            f = f * noise
            fb = fb * noise
        self.last_forward_s = f
        if candidates:
            self.verify_s += f
            self.verify_base_s += fb
        return start + draft_s + f + ot
