"""Sampling parameters and the one transform applied identically to target p and draft q.

Invariant: verification is exact only if the draft distribution q and the target
distribution p are produced by the *same* transform (temperature, then top-k, then top-p)
of their respective logits. Everything that turns logits into probabilities goes through
:func:`probs_from_logits`.

Safety invariant: for every accepted :class:`SamplingParams` and every logits row with at
least one finite entry, :func:`probs_from_logits` returns finite probabilities that sum to 1
with the row's top token kept. The limits that make this hold:

- ``temperature < GREEDY_EPS`` (1e-5, vLLM's sampling epsilon) *is* greedy: ``greedy`` is true
  and every engine path takes the argmax (the limit of softmax(l / T) as T -> 0 is the argmax
  one-hot; dividing by 1e-40 would overflow to inf and give NaN probabilities);
- if l / T overflows, the logits are shifted by their row maximum first (softmax is
  shift-invariant; ordinary rows are computed exactly as before, bit for bit);
- top-p below ``TOP_P_MIN`` is clamped to it, and the top token is always kept (float32
  cannot represent 1e-300, so "mass before >= top_p" would otherwise drop every token);
- NaN logits count as -inf (never sampled).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from specledger.errors import require

#: temperatures below this are greedy (argmax)
GREEDY_EPS = 1e-5
#: the smallest top-p applied; smaller values keep only the top token either way
TOP_P_MIN = 1e-6


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature < GREEDY_EPS (0 included) means greedy (argmax); top_k == 0 and top_p == 1
    disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.temperature, numbers.Real) and not isinstance(self.temperature, bool)
                and math.isfinite(self.temperature) and self.temperature >= 0,
                f"temperature must be a finite number >= 0, got {self.temperature!r}")
        require(isinstance(self.top_k, numbers.Integral) and not isinstance(self.top_k, bool) and self.top_k >= 0,
                f"top_k must be an integer >= 0, got {self.top_k!r}")
        require(isinstance(self.top_p, numbers.Real) and not isinstance(self.top_p, bool)
                and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def probs_from_logits(logits, params: SamplingParams):
    """softmax(filter_top_p(filter_top_k(logits / T))) over the last dimension, in float32.

    ``logits``: tensor [..., V]. Greedy params are not valid here (use argmax). top-p keeps the
    smallest prefix (by descending probability) whose mass reaches max(top_p, TOP_P_MIN), and
    always the top token; ties at the top-k boundary are all kept.
    """
    import torch

    assert not params.greedy, "probs_from_logits is for sampling; greedy uses argmax"
    x = logits.float()
    if not bool(torch.isfinite(x).all()):  # NaN never sampled; +inf is the largest float
        x = torch.nan_to_num(x, nan=float("-inf"), posinf=torch.finfo(x.dtype).max, neginf=float("-inf"))
    scaled = x / params.temperature
    if bool(torch.isposinf(scaled).any()):  # l / T overflowed: shift by the row max first (same softmax)
        scaled = (x - x.amax(dim=-1, keepdim=True)) / params.temperature
    x = scaled
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    top_p = max(float(params.top_p), TOP_P_MIN)
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (always keep the top token)
        cum_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = cum_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)
