"""Ledger-consistent synthetic traces: requests built from rounds with known K and known costs.

Used to check the analysis against hand computation and to demo the report without a model.
Every committed token of a round leaves together (one chunk) when the round ends; the prefill
emits no token, so TTFT = t_prefill + first round time and total_time = t_prefill + Σ t_round.
"""

from __future__ import annotations

from collections.abc import Sequence

from specledger.records import RequestRecord, RoundRecord


def plain_rounds(
    n_tokens: int, t_verify: float, t_other: float = 0.0, context_start: int = 10
) -> list[RoundRecord]:
    """``n_tokens`` plain decoding steps (proposed 0, committed 1)."""
    return [
        RoundRecord("none", 0, 0, 0, 1, False, 0.0, t_verify, t_other, context_start + i)
        for i in range(n_tokens)
    ]


def spec_rounds(
    drafter: str,
    gamma: int,
    accepted: Sequence[int],
    t_draft: float,
    t_verify: float,
    t_other: float = 0.0,
    proposed: Sequence[int] | None = None,
    truncate_last_to: int | None = None,
    context_start: int = 10,
) -> list[RoundRecord]:
    """Speculative rounds with the given K per round (L = K + 1); the last one optionally truncated
    to commit ``truncate_last_to`` tokens (a stop condition inside the accepted span)."""
    out: list[RoundRecord] = []
    ctx = context_start
    for i, k in enumerate(accepted):
        prop = gamma if proposed is None else proposed[i]
        committed, truncated = k + 1, False
        if truncate_last_to is not None and i == len(accepted) - 1:
            committed, truncated = truncate_last_to, True
        out.append(
            RoundRecord(drafter, gamma, prop, k, committed, truncated, t_draft, t_verify, t_other, ctx)
        )
        ctx += committed
    return out


def request_from_rounds(
    request_id: str,
    prompt_id: str,
    rounds: list[RoundRecord],
    *,
    category: str = "synthetic",
    temperature: float = 0.0,
    t_prefill: float = 0.0,
    token_ids: list[int] | None = None,
    quality: float | None = None,
    prompt_tokens: int = 10,
) -> RequestRecord:
    """A request whose timing, chunks and token times follow exactly from its rounds."""
    drafter = rounds[0].drafter if rounds else "none"
    gamma = rounds[0].gamma if rounds else 0
    token_times: list[float] = []
    chunks: list[int] = []
    now = t_prefill
    for rd in rounds:
        now += rd.t_round
        if rd.committed > 0:
            token_times.extend([now] * rd.committed)
            chunks.append(rd.committed)
    n = len(token_times)
    ids = list(range(n)) if token_ids is None else list(token_ids)
    extra = {} if quality is None else {"quality": quality}
    return RequestRecord(
        request_id=request_id,
        drafter=drafter,
        gamma=gamma,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        seed=0,
        prompt_tokens=prompt_tokens,
        output_tokens=n,
        text="",
        token_ids=ids,
        stop_reason="length",
        t_prefill=t_prefill,
        ttft=token_times[0] if token_times else t_prefill,
        total_time=token_times[-1] if token_times else t_prefill,
        token_times=token_times,
        chunks=chunks,
        rounds=rounds,
        category=category,
        prompt_id=prompt_id,
        extra=extra,
    )
