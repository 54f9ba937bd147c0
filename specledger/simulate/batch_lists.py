"""The running batch as Python lists, for the scalar fast path (:func:`specledger.simulate.fastpath.run_small_batch`).

Request i (by index) is kept as what changes least while it runs:

    rem_i   = T_i - o_i                 output tokens still to commit
    cbase_i = context_i + rem_i         constant while it runs (a committed token adds to one, takes from the other)
    roff_i  = rounds_done_i - s         s the steps taken so far; a request prefilling in the next step: one less
    nxt_i   = its next round, wide-coded P << WIDE | (K + 1) (rounds.WIDE), clamps applied

so a step commits request i with rem_i -= nxt_i & WIDE_MASK (it commits K + 1 tokens: K <= P <= gamma <= rem - 1)
and its context, rounds and gamma follow: context = cbase - rem, rounds_done = roff + s,
gamma = max(min(G, rem - 1), 0) (the replica's clamp, :meth:`Replica.step_from`)."""

from __future__ import annotations

import math

import numpy as np

from specledger.simulate.rounds import WIDE, WIDE_MASK
from specledger.simulate.state import RunningBatch


def clamp_gamma(gamma: int, rem: int) -> int:
    """The gamma a request with ``rem`` tokens left asks: max(min(gamma, rem - 1), 0)."""
    return gamma if gamma < rem - 1 else (rem - 1 if rem > 1 else 0)


def clamped(w: int, g: int) -> int:
    """Wide code ``w`` (the outcome at the full gamma) at gamma ``g``: P = min(P*, g), K = min(K*, P)."""
    p = w >> WIDE
    k = (w & WIDE_MASK) - 1
    if p > g:
        p = g
    if k > p:
        k = p
    return p << WIDE | (k + 1)


def exact_blocks(rem: list[int], cbase: list[int], prefill_left: list[int], nxt: list[int], gamma: int,
                 reserve: bool, bs: int) -> int:
    """The step's KV blocks: sum_i ceil(need_i / bs), need_i = context_i (prefilling) or context_i + (g_i if
    ``reserve`` else P_i) (decoding)."""
    blocks = 0
    for i in range(len(rem)):
        need = cbase[i] - rem[i]
        if not prefill_left[i]:
            need += clamp_gamma(gamma, rem[i]) if reserve else nxt[i] >> WIDE
        blocks += need if bs == 1 else -(-need // bs)
    return blocks


def fill_gammas(gammas: list[int], rem: list[int], prefill_left: list[int], gamma: int) -> None:
    """``gammas[i]``: request i's clamped gamma (0 where it prefills), for :meth:`StepPrices.draft_total`."""
    for i in range(len(rem)):
        gammas[i] = 0 if prefill_left[i] else clamp_gamma(gamma, rem[i])


def settle(last_emit: list[float], worst_gap: list[float], t_emit: float, run_max: float) -> None:
    """Write the lazily kept state: every request last emitted at ``t_emit``; its worst gap is at least ``run_max``
    (the largest gap of the steps all took since theirs were written)."""
    for i in range(len(last_emit)):
        last_emit[i] = t_emit
        if run_max > worst_gap[i]:
            worst_gap[i] = run_max


def read_batch(batch: RunningBatch) -> tuple[list[int], list[int], list[int], list[int], list[float], list[int],
                                               list[int]]:
    """(request, target, rem, cbase, last_emit, prefill_left, roff) of ``batch`` at s = 0."""
    rem = batch.target - batch.out
    roff = batch.rounds_done - (batch.prefill_left > 0)
    return (batch.request.tolist(), batch.target.tolist(), rem.tolist(), (batch.context + rem).tolist(),
            batch.last_emit.tolist(), batch.prefill_left.tolist(), roff.tolist())


def write_batch(batch: RunningBatch, chain: np.ndarray, draw_key: np.ndarray, request: list[int], target: list[int],
                rem: list[int], cbase: list[int], last_emit: list[float], prefill_left: list[int], roff: list[int],
                s: int) -> np.ndarray:
    """Write the lists back into ``batch`` after s steps (``chain``, ``draw_key``: SimCounters'); returns the ids."""
    ids = np.array(request, dtype=np.int64)
    r = np.array(rem, dtype=np.int64)
    pre = np.array(prefill_left, dtype=np.int64)
    batch.request = ids
    batch.target = np.array(target, dtype=np.int64)
    batch.out = batch.target - r
    batch.context = np.array(cbase, dtype=np.int64) - r
    batch.last_emit = np.array(last_emit, dtype=np.float64)
    batch.prefill_left = pre
    batch.rounds_done = np.array(roff, dtype=np.int64) + s + (pre > 0)
    batch.chain = chain[ids]
    batch.draw_key = draw_key[ids]
    return ids


NO_GAP = -math.inf  # a worst gap before any gap
