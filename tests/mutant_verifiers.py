"""Three wrong acceptance rules, each a one-line departure from specledger.engine.verify.verify_sampling.

Used by the mutation tests of the sampled-correctness gate (tests/test_correctness_power.py):
the gate must fail each with high probability and pass the correct rule.
"""

from __future__ import annotations

import torch

from specledger.engine.verify import _sample


def _rule(target_probs, candidates, draft_probs, rng, mode):
    n = len(candidates)
    if n:
        idx = torch.arange(n)
        cand = torch.tensor(candidates, dtype=torch.long)
        p_x = target_probs[idx, cand]
        q_x = draft_probs[idx, cand] if draft_probs is not None else torch.ones(n)
        u = torch.rand(n, generator=rng)
        if mode == "accept-always":
            rejected = torch.zeros(0, 1, dtype=torch.long)
        elif mode == "pq-swapped":  # accept with min(1, q/p) instead of min(1, p/q)
            rejected = (u * p_x >= q_x).nonzero()
        else:
            rejected = (u * q_x >= p_x).nonzero()
        if len(rejected):
            k = int(rejected[0, 0])
            if mode == "pq-swapped":  # ... and the residual max(0, q - p)
                residual = target_probs[k].clone() * 0
                if draft_probs is not None:
                    residual = (draft_probs[k] - target_probs[k]).clamp(min=0.0)
                if float(residual.sum()) <= 0:
                    residual = target_probs[k]
                return k, candidates[:k] + [_sample(residual, rng)]
            residual = target_probs[k].clone()
            if draft_probs is not None:
                residual = (residual - draft_probs[k]).clamp_(min=0.0)
            else:
                residual[candidates[k]] = 0.0
            if mode == "not-renormalised":
                # inverse-CDF draw that assumes the residual sums to 1: the mass it lacks falls
                # through to a draw from p (the unnormalised residual's shortfall is not spread over it)
                cdf = residual.cumsum(0)
                v = float(torch.rand(1, generator=rng))
                j = int(torch.searchsorted(cdf, torch.tensor([v]))[0])
                tok = j if j < len(residual) and v < float(cdf[-1]) else _sample(target_probs[k], rng)
                return k, candidates[:k] + [tok]
            if float(residual.sum()) <= 0.0:
                residual = target_probs[k]
            return k, candidates[:k] + [_sample(residual, rng)]
    return n, candidates + [_sample(target_probs[n], rng)]


def mutant(mode: str):
    def verify(target_probs, candidates, draft_probs, rng):
        return _rule(target_probs, candidates, draft_probs, rng, mode)

    verify.__name__ = f"verify_{mode.replace('-', '_')}"
    return verify


MUTANTS = ("accept-always", "pq-swapped", "not-renormalised")
