"""Requests' acceptance rounds drawn ahead in bulk, for the scalar fast path
(:func:`specledger.simulate.fastpath.run_small_batch`)."""

from __future__ import annotations

import numpy as np

from specledger.errors import require
from specledger.simulate.chains import ChainTable, Draws

CHUNK = 4096  # requests whose rounds are drawn together
KEEP_CHUNKS = 4  # chunks kept behind the newest one
BLOCK = 8192  # rounds drawn in one go: the hash's temporaries stay in cache (measured: the hash ~1.8x faster)


WIDE = 16  # a wide round code: P << WIDE | (K + 1); sums over < 2048 requests keep the fields apart
WIDE_MASK = (1 << WIDE) - 1


class RoundCache:
    """Every request's rounds drawn ahead, CHUNK requests at a time: round r of request i is the outcome
    (P*_ir, K*_ir) at the full gamma (keyed draws, so exactly what :meth:`ChainTable.sample` gives that
    round whenever it is taken), held wide-coded, P* << WIDE | (K* + 1) (:meth:`held_rounds`: a sum of codes
    is (sum P*) << WIDE | (sum K* + count)), and handed out by :meth:`rounds` as P* * 32 + K*. A request gets
    ceil(1.3 T / (E[K] + 1)) + 4 rounds (T its output tokens, E[K] its chain's expectation at gamma);
    a request that needs more (token budget trims) has them drawn when asked.

    ``chain``, ``draw_key`` and ``target``: every simulated request's measured request, draw key and output
    tokens (:class:`specledger.simulate.state.SimCounters`)."""

    def __init__(self, table: ChainTable, draws: Draws, gamma: int, chain: np.ndarray, draw_key: np.ndarray,
                 target: np.ndarray) -> None:
        self.table, self.draws = table, draws
        self.chain, self.draw_key, self.target = chain, draw_key, target
        self.gamma = gamma
        self.width = min(gamma, self.table.max_gamma)
        require(self.table.max_gamma < 32, "rounds are coded in 5 bits")
        self.chunks: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self.held: dict[int, tuple[int, list[int]]] = {}  # a running request's fetched rounds: (first, codes)

    def _outcomes(self, keys: np.ndarray, rounds: np.ndarray, chain: np.ndarray) -> np.ndarray:
        """Wide codes of rounds ``rounds`` of the requests keyed ``keys`` on chains ``chain``, BLOCK rounds at a time
        (every round on its own: the blocks only keep the temporaries in cache)."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        for lo in range(0, keys.shape[0], BLOCK):
            sl = slice(lo, lo + BLOCK)
            p, k = self.table.full_outcomes(chain[sl], self.draws.uniforms(keys[sl], rounds[sl], self.width))
            out[sl] = (p.astype(np.int64) << WIDE) | (k.astype(np.int64) + 1)
        return out

    def _build(self, c: int) -> tuple[list[int], list[int], list[int]]:
        lo, hi = c * CHUNK, min(self.chain.shape[0], (c + 1) * CHUNK)
        chain, target = self.chain[lo:hi], self.target[lo:hi]
        _, ek = self.table.expected(chain, np.full(hi - lo, self.width, dtype=np.int64))
        count = np.minimum(np.ceil(1.3 * target / (ek + 1)).astype(np.int64) + 4, target + 1)
        start = np.cumsum(count) - count
        total = int(count.sum())
        keys = np.repeat(self.draw_key[lo:hi], count)
        rounds = np.arange(total) - np.repeat(start, count)
        codes = self._outcomes(keys, rounds, np.repeat(chain, count))
        ent = (start.tolist(), count.tolist(), codes.tolist())  # lists: a request's rounds are a slice
        for old in [k for k in self.chunks if k < c - KEEP_CHUNKS]:  # requests long gone (redrawn if ever asked)
            del self.chunks[old]
        self.chunks[c] = ent
        return ent

    def rounds(self, request: int, first: int, limit: int) -> list[int]:
        """Codes P* * 32 + K* of request ``request``'s rounds first, first + 1, ... (at least one, at most
        ``limit``)."""
        return [(w >> WIDE) * 32 + (w & WIDE_MASK) - 1 for w in self._wide(request, first, limit)]

    def _wide(self, request: int, first: int, limit: int) -> list[int]:
        """:meth:`rounds`, wide-coded."""
        if self.width == 0:
            return [1] * limit
        c = request // CHUNK
        ent = self.chunks.get(c) or self._build(c)
        i = request - c * CHUNK
        o, n = ent[0][i], ent[1][i]
        if first < n:
            return ent[2][o + first:o + min(n, first + limit)]
        return self._outcomes(np.full(limit, self.draw_key[request]), np.arange(first, first + limit),
                              np.full(limit, self.chain[request])).tolist()

    def held_rounds(self, request: int, first: int, limit: int) -> tuple[int, list[int]]:
        """The rounds fetched for ``request`` (the first one's index, their wide codes), fetched anew from round
        ``first`` when those run out before it."""
        h = self.held.get(request)
        if h is None or first - h[0] >= len(h[1]):
            h = self.held[request] = (first, self._wide(request, first, limit))
        return h
