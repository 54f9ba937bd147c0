"""Samples for the sampled-correctness gate (:mod:`specledger.gates.sampled_stats`): many speculative and
plain samples of one prompt drawn with the batch engine, each output token scored by the target (the log-probability
test's input). The engine side of the gate; the statistics live with the gates."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specledger.gates.sampled_stats import DEFAULT_SAMPLES, DEFAULT_TOKENS

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


def sample_pairs(
    model: Transformer,
    prompt: Sequence[int],
    drafter_factory: Any,
    gamma: int,
    temperature: float,
    n: int = DEFAULT_SAMPLES,
    tokens: int = DEFAULT_TOKENS,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    max_batch: int = 64,
    prompt_id: str = "p",
    category: str = "",
    tokenizer: Any = None,
) -> tuple[list[Any], list[Any]]:
    """``n`` speculative and ``n`` plain samples of one prompt (``tokens`` each, EOS ignored), drawn with
    the batch engine, seeds ``seed..seed+n-1`` (spec) and ``seed+n..`` (plain). Returns (spec, plain) records."""
    from specledger.engine.batch import BatchEngine, BatchRequest
    from specledger.engine.drafters.base import NoDrafter
    from specledger.engine.sampling import SamplingParams

    capacity = len(prompt) + tokens + 64
    engine = BatchEngine(model, tokenizer, max_batch=max_batch, capacity=capacity)

    def reqs(offset: int) -> list[BatchRequest]:
        return [
            BatchRequest(list(prompt), tokens, SamplingParams(temperature, top_k, top_p, seed + offset + i),
                         request_id=f"{prompt_id}#{offset + i}", category=category, prompt_id=prompt_id,
                         ignore_eos=True)
            for i in range(n)
        ]

    spec = engine.run(reqs(0), drafter_factory, gamma, concurrency=max_batch)
    base = engine.run(reqs(n), NoDrafter, 0, concurrency=max_batch)
    params = SamplingParams(temperature, top_k, top_p)
    score_records(model, prompt, spec, params, max_batch)
    score_records(model, prompt, base, params, max_batch)
    return spec, base


def score_records(model: Transformer, prompt: Sequence[int], records: Sequence[Any], params: Any,
                  batch: int = 32) -> None:
    """Store in each record's ``extra["target_logprobs"]`` the target's log-probability (under the
    sampling transform ``params``) of each output token, by one teacher-forced forward per batch."""
    import torch

    from specledger.engine.sampling import probs_from_logits

    by_len: dict[int, list[Any]] = defaultdict(list)
    for r in records:
        by_len[len(r.token_ids)].append(r)
    n_prompt = len(prompt)
    for k, group in by_len.items():
        if k == 0:
            continue
        for i in range(0, len(group), batch):
            chunk = group[i : i + batch]
            toks = torch.tensor([list(prompt) + list(r.token_ids) for r in chunk], dtype=torch.long)
            cache = model.new_cache(toks.shape[1] + 1, batch_size=len(chunk))
            with torch.no_grad():
                logits = model(toks, 0, cache)[:, n_prompt - 1 : n_prompt - 1 + k]
            probs = probs_from_logits(logits, params)
            out = toks[:, n_prompt:].unsqueeze(-1)
            lp = probs.gather(-1, out).squeeze(-1).clamp_min(1e-30).log()
            ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
            for r, row, h in zip(chunk, lp.tolist(), ent.tolist()):
                r.extra["target_logprobs"] = [round(x, 6) for x in row]
                r.extra["target_entropy"] = [round(x, 6) for x in h]
