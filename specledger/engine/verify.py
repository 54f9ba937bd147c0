"""Verification: decide which proposed tokens the target accepts. Exactness lives here.

Given n candidates x_1..x_n and the target's logits at the n+1 positions (context end,
x_1, ..., x_n), both verifiers return (K, tokens) with tokens = x_1..x_K + [t], len K + 1:

* greedy: K = length of the longest prefix with x_i == argmax p_i; t = argmax p_{K+1}.
  The output is token-identical to plain greedy decoding of the target.
* sampling (Leviathan et al. 2023; Chen et al. 2023): accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample t from
  normalize(max(0, p_i - q_i)); if all n are accepted sample the bonus t from p_{n+1}.
  Each emitted token is then distributed exactly as p. A drafter without probabilities
  has one-hot q (q_i(x_i) = 1): accept with probability p_i(x_i), and the residual is p_i
  with x_i removed.
"""

from __future__ import annotations

from typing import Any

import torch


def argmax_rows(logits: torch.Tensor) -> Any:
    """Each row's argmax of ``logits`` [..., V] as Python ints (an int for one row of shape [V]): the first of equal
    maxima, a NaN counting as the maximum -- torch's rule. On a CPU float tensor numpy's vectorized argmax computes it
    (4 us for a 49152-wide row against torch's 43 us: a greedy decode step's read-back), elsewhere torch's."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def verify_greedy(target_logits: torch.Tensor, candidates: list[int]) -> tuple[int, list[int]]:
    """``target_logits``: [n+1, V]. Longest prefix of ``candidates`` equal to the target's argmax, then the
    target's token."""
    best = argmax_rows(target_logits)
    k = 0
    n = len(candidates)
    while k < n and candidates[k] == best[k]:
        k += 1
    return k, candidates[:k] + [best[k]]


def _sample(probs: torch.Tensor, rng: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=rng).item())


def verify_sampling(
    target_probs: torch.Tensor,
    candidates: list[int],
    draft_probs: torch.Tensor | None,
    rng: torch.Generator,
) -> tuple[int, list[int]]:
    """Rejection sampling. ``target_probs``: [n+1, V] (already temperature/top-k/top-p processed);
    ``draft_probs``: [n, V] with the distributions the candidates were sampled from, or None (one-hot)."""
    n = len(candidates)
    if n:
        device = target_probs.device
        idx = torch.arange(n, device=device)
        cand = torch.tensor(candidates, dtype=torch.long, device=device)
        p_x = target_probs[idx, cand]
        q_x = draft_probs[idx, cand] if draft_probs is not None else torch.ones(n, device=device)
        u = torch.rand(n, generator=rng, device=device)
        # accept x_i iff u_i * q(x_i) < p(x_i)   (== u_i < min(1, p/q), safe for q = 0)
        rejected = (u * q_x >= p_x).nonzero()
        if len(rejected):
            k = int(rejected[0, 0])
            residual = target_probs[k].clone()
            if draft_probs is not None:
                residual = (residual - draft_probs[k]).clamp_(min=0.0)
            else:
                residual[candidates[k]] = 0.0
            total = float(residual.sum())
            if total <= 0.0:  # p == q numerically: any rejection is measure-zero; fall back to p
                residual = target_probs[k]
            return k, candidates[:k] + [_sample(residual, rng)]
    return n, candidates + [_sample(target_probs[n], rng)]
