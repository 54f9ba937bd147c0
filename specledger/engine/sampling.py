"""Sampling parameters and the one transform applied identically to target p and draft q.

Invariant: verification is exact only if the draft distribution q and the target
distribution p are produced by the *same* transform (temperature, then top-k, then top-p)
of their respective logits. Everything that turns logits into probabilities goes through
:func:`probs_from_logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specledger.errors import require


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature == 0 means greedy (argmax); top_k == 0 and top_p == 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits, params: SamplingParams):
    """softmax(filter_top_p(filter_top_k(logits / T))) over the last dimension, in float32.

    ``logits``: tensor [..., V]. Greedy params are not valid here (use argmax).
    """
    import torch

    assert not params.greedy, "probs_from_logits is for sampling; greedy uses argmax"
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (always keep the top token)
        cum_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = cum_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)
