"""Acceptance sampled per request per round from measured conditional chains.

Each simulated request draws one measured request's chain (its own a_1..a_G and fill q_1..q_G),
so the spread *between* requests survives into the tails (ITL P99, longest stall); every round
then draws, for all running requests at once:

    proposed P = #{i <= g : U_1..U_i < q_1..q_i}            (the drafter fills q of what it is asked)
    accepted K = #{j <= P : V_1..V_j < a_1..a_j}            (the first rejection ends the run)

with U, V uniform. The uniforms are *keyed* (:class:`Draws`): U and V of position i in round k of
a request are a hash of (seed, the request's key, k, i) -- counter-based, as in JAX/Philox -- so a
request's outcome does not depend on which others share its steps, on how far ahead they are drawn,
or on the width of the draw (a simulator may draw a request's rounds one step at a time or many
ahead and get the same outcomes). Key = the simulated request (``per="request"``: each request is a
fresh prompt like the measured one) or the measured prompt it replays (``per="prompt"``: greedy
decoding is a function of the prompt, so two requests replaying one prompt at one gamma accept the
same tokens round by round and finish in the same step -- what a greedy replay of a sweep does).
``mean_only`` replaces every chain by the pooled mean chain (no spread between
requests) and ``deterministic`` commits exactly E[K] per round through a running fraction -- the
inference-sim model, whose ITL has no variance -- kept to show what the tails lose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import require

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic): a bijection that scrambles bits."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _unit(h: np.ndarray) -> np.ndarray:
    """The top 53 bits of uint64 hashes as floats in [0, 1) (converted as int64: they fit, and numpy converts
    int64 faster than uint64)."""
    return (h >> np.uint64(11)).view(np.int64).astype(np.float64) * (1.0 / (1 << 53))


def keyed_uniforms(seed: int, keys: np.ndarray, rounds: np.ndarray, width: int) -> np.ndarray:
    """U[0] (fill) and U[1] (accept) of shape (2, b, width) in [0, 1): element (w, i, j) depends only on
    (seed, keys[i], rounds[i], j, w) -- never on b, width or the other rows."""
    with np.errstate(over="ignore"):
        k = np.asarray(keys, dtype=np.int64).astype(np.uint64)
        r = np.asarray(rounds, dtype=np.int64).astype(np.uint64)
        base = _mix(_mix(np.full(k.shape, seed, dtype=np.uint64) * _GOLDEN + k) + r * _GOLDEN)
        pos = (np.arange(2 * width, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        h = _mix(base[:, None] + pos[None, :])
    return _unit(h).reshape(k.shape[0], width, 2).transpose(2, 0, 1)


@dataclass(frozen=True)
class Draws:
    """Where a simulation's acceptance uniforms come from: ``seed`` and what a draw is keyed on."""

    seed: int = 0
    per: str = "request"  # "request" | "prompt"

    def __post_init__(self) -> None:
        require(self.per in ("request", "prompt"), f"draws are keyed per 'request' or 'prompt', not {self.per!r}")

    def uniforms(self, keys: np.ndarray, rounds: np.ndarray, width: int) -> np.ndarray:
        return keyed_uniforms(self.seed, keys, rounds, width)


def _extend(values: Sequence[float], n: int, default: float) -> list[float]:
    """``values`` to length n: positions never measured take the last measured value (``default`` if none)."""
    vals = [float(v) for v in values if v is not None]
    last = vals[-1] if vals else default
    return (vals + [last] * n)[:n]


def _conditional(q: Sequence[float]) -> list[float]:
    """Survival q_i = prod_(k<=i) f_k -> conditional f_i = q_i / q_(i-1)."""
    out, prev = [], 1.0
    for v in q:
        out.append(float(v) / prev if prev > 0 else 0.0)
        prev = float(v)
    return out


@dataclass
class ChainTable:
    """Rows = measured requests. accept[i, j] = a_(j+1) of request i; fill[i, j] = q_(j+1)."""

    accept: np.ndarray
    fill: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    categories: list[str]
    drafter: str = PLAIN.name
    assumption: str = ""
    deterministic: bool = False

    @property
    def size(self) -> int:
        return int(self.accept.shape[0])

    @property
    def max_gamma(self) -> int:
        return int(self.accept.shape[1])

    @classmethod
    def from_chains(cls, chains: Sequence[Any], max_gamma: int = 16, drafter: str = "",
                    assumption: str = "") -> ChainTable:
        """From bare RequestChain-like objects (``chain`` a_j, ``fill`` q_i = Pr(proposed >= i | asked >= i),
        ``prompt_tokens``, ``output_tokens``, ``category``). Unmeasured positions: the request's last
        measured a_j (the pooled a_1 when it has none); the conditional fill q_i / q_(i-1) likewise (1
        when never asked)."""
        require(len(chains) > 0, "no measured requests to take acceptance from")
        g = max(1, max_gamma)
        measured = [c for c in chains if c.chain]
        w = np.array([max(getattr(c, "weight", 1.0), 1e-9) for c in measured])
        pooled_a1 = float(np.average([c.chain[0] for c in measured], weights=w)) if measured else 0.0
        acc = np.array([_extend(c.chain, g, pooled_a1) for c in chains], dtype=float)
        fil = np.array([_extend(_conditional(c.fill or []), g, 1.0) for c in chains], dtype=float)
        return cls(np.clip(acc, 0, 1), np.clip(fil, 0, 1),
                   np.array([int(c.prompt_tokens) for c in chains], dtype=np.int64),
                   np.array([max(1, int(c.output_tokens)) for c in chains], dtype=np.int64),
                   [str(c.category) for c in chains], drafter or str(getattr(chains[0], "drafter", "")),
                   assumption or "a_j beyond a request's last measured position = its last measured a_j; "
                   "a request with none takes the pooled a_1; fill likewise (1 when never asked)")

    @classmethod
    def from_model(cls, model: Any, chains: Sequence[Any], max_gamma: int = 16) -> ChainTable:
        """From an :class:`specledger.predict.acceptance.AcceptanceModel` and some of its requests: each
        row is ``model.request_chain(req, max_gamma)`` (a_j and the conditional fill, with the model's
        stated assumption for unmeasured positions)."""
        require(len(chains) > 0, "no measured requests to take acceptance from")
        g = max(1, max_gamma)
        pooled: dict[tuple[str, str], Any] = {}
        rows_a, rows_f = [], []
        for c in chains:
            key = (c.category, c.drafter)
            if key not in pooled:
                pooled[key] = model.pooled(c.category, c.drafter, g)
            a, f = model.request_chain(c, g, pooled[key])
            rows_a.append(a)
            rows_f.append(f)
        return cls(np.clip(np.array(rows_a, dtype=float), 0, 1), np.clip(np.array(rows_f, dtype=float), 0, 1),
                   np.array([int(c.prompt_tokens) for c in chains], dtype=np.int64),
                   np.array([max(1, int(c.output_tokens)) for c in chains], dtype=np.int64),
                   [str(c.category) for c in chains], str(chains[0].drafter), str(model.assumption))

    @classmethod
    def plain(cls, prompt_tokens: Sequence[int], output_tokens: Sequence[int],
              categories: Sequence[str] | None = None) -> ChainTable:
        """No drafter: every chain is 0 (used with gamma 0, or to check the plain reduction)."""
        n = len(prompt_tokens)
        return cls(np.zeros((n, 1)), np.zeros((n, 1)), np.asarray(prompt_tokens, dtype=np.int64),
                   np.asarray(output_tokens, dtype=np.int64), list(categories or [""] * n), PLAIN.name,
                   "plain decoding")

    def mean_only(self, deterministic: bool = False) -> ChainTable:
        """Every request gets the mean chain (survival-weighted: a_j = E[prod_(i<=j) a] / E[prod_(i<j) a])."""
        surv = np.cumprod(self.accept, axis=1).mean(axis=0)
        prev = np.concatenate([[1.0], surv[:-1]])
        a = np.where(prev > 0, surv / np.maximum(prev, 1e-12), 0.0)
        fs = np.cumprod(self.fill, axis=1).mean(axis=0)
        fprev = np.concatenate([[1.0], fs[:-1]])
        q = np.where(fprev > 0, fs / np.maximum(fprev, 1e-12), 0.0)
        n = self.size
        return ChainTable(np.tile(a, (n, 1)), np.tile(q, (n, 1)), self.prompt_tokens, self.output_tokens,
                          self.categories, self.drafter,
                          "mean chain for every request" + (", E[K] committed every round (no variance)"
                                                            if deterministic else ""), deterministic)

    def expected(self, idx: np.ndarray, gamma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(E[P], E[K]) per request at its gamma: E[P] = sum_i prod_(i'<=i) q, E[K] = sum_j prod q*a."""
        g = int(gamma.max()) if gamma.size else 0
        if g == 0:
            z = np.zeros(idx.shape[0])
            return z, z
        g = min(g, self.max_gamma)
        cols = np.arange(g)[None, :] < gamma[:, None]
        fs = np.cumprod(self.fill[idx, :g], axis=1) * cols
        ks = np.cumprod(self.fill[idx, :g] * self.accept[idx, :g], axis=1) * cols
        return fs.sum(axis=1), ks.sum(axis=1)

    def sample(self, idx: np.ndarray, gamma: np.ndarray, draws: np.random.Generator | Draws,
               keys: np.ndarray | None = None, rounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(proposed, accepted) for requests with chain rows ``idx`` asked ``gamma`` candidates each.
        ``draws``: a Generator (fresh uniforms) or :class:`Draws` with each request's ``keys`` and
        ``rounds`` (its round number). Prefix-consistent: with keyed draws, the outcome at gamma g is
        (min(P, g), min(K, min(P, g))) of the outcome at any larger gamma."""
        b = idx.shape[0]
        g = int(gamma.max()) if b else 0
        if g == 0:
            z = np.zeros(b, dtype=np.int64)
            return z, z
        g = min(g, self.max_gamma)
        gamma = np.minimum(gamma, g)
        if isinstance(draws, Draws):
            require(keys is not None and rounds is not None, "keyed draws need each request's key and round")
            u = draws.uniforms(keys, rounds, g)  # type: ignore[arg-type]
        else:
            u = draws.random((2, b, g))
        p_full, k_full = self.full_outcomes(idx, u)
        proposed = np.minimum(p_full, gamma)  # positions beyond a request's own gamma are not proposed
        return proposed.astype(np.int64), np.minimum(k_full, proposed).astype(np.int64)

    def full_outcomes(self, idx: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P*, K*) when asked every one of the w = u.shape[-1] positions: P* = consecutive fills
        (U[0] < q), K* = consecutive accepts (U[1] < a) among them. ``idx``: chain rows of any shape;
        ``u``: (2, *idx.shape, w). At a gamma g < w the outcome is (min(P*, g), min(K*, min(P*, g)))."""
        w = u.shape[-1]
        filled = np.cumprod(u[0] < self.fill[idx, :w], axis=-1)
        accepted = np.cumprod((u[1] < self.accept[idx, :w]) & (filled > 0), axis=-1)
        return filled.sum(axis=-1), accepted.sum(axis=-1)


#: streams of :func:`keyed_stream` (distinct from the acceptance draws of :func:`keyed_uniforms`)
STREAM_STEP_JITTER = 1  # key = replica index, counter = that replica's step number
STREAM_PREFILL_JITTER = 2  # key = request id, counter = its admission number (0, then 1 per preemption)


def keyed_stream(seed: int, stream: int, keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per (key, counter) of a named ``stream``: element i depends only on
    (seed, stream, keys[i], counters[i]) -- h = mix(mix(mix(mix(seed) + stream) + key * phi) + counter * phi),
    u = top 53 bits of h / 2^53 -- so a step's noise is the same whichever path (one step or a segment
    of steps, :mod:`specledger.simulate.fastpath`) prices it."""
    with np.errstate(over="ignore"):
        k = np.asarray(keys, dtype=np.int64).astype(np.uint64)
        c = np.asarray(counters, dtype=np.int64).astype(np.uint64)
        s = _mix(_mix(np.full(k.shape, seed, dtype=np.uint64)) + np.uint64(stream))
        h = _mix(_mix(s + k * _GOLDEN) + c * _GOLDEN)
    return _unit(h)
