"""Per-scenario ledger figures from raw records: throughput, E[L], acceptance, round times, latency.

Definitions (all times in the returned dicts are milliseconds, named ``*_ms``):

- *full round*: a round that was not truncated by a stop condition. Acceptance statistics
  (K histogram, a_j, E[L]) use full rounds only; token and time totals use every round.
- E[L] measured = Σ committed / #rounds over full rounds (zero-proposal rounds included:
  they commit 1 and cost a round). E[L] of the proposing rounds and E[L] of the
  conditional chain (1 + Σ Π a_j) are reported next to it.
- a_j = Pr(K ≥ j | K ≥ j−1) over full rounds that proposed ≥ j candidates.
- T0 = Σ t_round / Σ committed over the baseline's rounds (one token per plain round,
  so it is the mean plain round time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from specledger.analysis.stats import distribution
from specledger.ledger.acceptance import expected_length_from_chain
from specledger.records import RequestRecord, RoundRecord

MS = 1e3


def all_rounds(records: Iterable[RequestRecord]) -> list[RoundRecord]:
    return [rd for r in records for rd in r.rounds]


def full_rounds(rounds: Iterable[RoundRecord]) -> list[RoundRecord]:
    """Rounds not cut by a stop condition: the only ones fit for acceptance statistics."""
    return [rd for rd in rounds if not rd.truncated]


def totals(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Requests, committed tokens, total seconds, tokens/s = Σ tokens / Σ time, and the misleading
    unweighted mean of per-request speeds (kept only to show how far it is from the truth)."""
    tokens = float(sum(r.output_tokens for r in records))
    seconds = float(sum(r.total_time for r in records))
    per_request = [r.output_tokens / r.total_time for r in records if r.total_time > 0]
    return {
        "requests": len(records),
        "tokens": tokens,
        "total_time_s": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        "mean_of_request_speeds": float(np.mean(per_request)) if per_request else math.nan,
    }


def baseline_t0(base_records: Sequence[RequestRecord]) -> float:
    """T0 in seconds per token: Σ t_round / Σ committed over plain rounds (NaN if none)."""
    rounds = [rd for rd in all_rounds(base_records) if rd.committed > 0]
    committed = sum(rd.committed for rd in rounds)
    return sum(rd.t_round for rd in rounds) / committed if committed else math.nan


def conditional_acceptance(rounds: Iterable[RoundRecord]) -> list[dict[str, float | int]]:
    """a_j per position j = 1..max proposed: a_j = #(K ≥ j) / #(K ≥ j−1) among full rounds with proposed ≥ j.

    Also the unconditional per-position rate (vLLM's accepted_per_pos / drafts) over full
    rounds that proposed at least one candidate. Positions where nobody reached K ≥ j−1 get a_j = None.
    """
    full = [rd for rd in full_rounds(rounds) if rd.proposed > 0]
    if not full:
        return []
    proposed = np.array([rd.proposed for rd in full])
    accepted = np.array([rd.accepted for rd in full])
    out = []
    for j in range(1, int(proposed.max()) + 1):
        at_risk = int(np.sum((proposed >= j) & (accepted >= j - 1)))
        passed = int(np.sum((proposed >= j) & (accepted >= j)))
        out.append(
            {
                "position": j,
                "at_risk": at_risk,
                "accepted": passed,
                "a": passed / at_risk if at_risk else None,
                "per_position_rate": float(np.sum(accepted >= j)) / len(full),
            }
        )
    return out


def chain_values(chain: list[dict], min_at_risk: int = 1) -> list[float]:
    """The a_j values up to the first position with fewer than ``min_at_risk`` observations."""
    values: list[float] = []
    for entry in chain:
        if entry["a"] is None or entry["at_risk"] < min_at_risk:
            break
        values.append(float(entry["a"]))
    return values


def k_histogram(rounds: Iterable[RoundRecord]) -> list[int]:
    """counts[k] = number of full, proposing rounds with K = k."""
    ks = [rd.accepted for rd in full_rounds(rounds) if rd.proposed > 0]
    if not ks:
        return []
    return np.bincount(np.asarray(ks, dtype=int)).astype(int).tolist()


def proposal_survival(rounds: Iterable[RoundRecord], max_position: int) -> list[float]:
    """q_i = Pr(proposed ≥ i | asked gamma ≥ i) for i = 1..max_position (1.0 for model drafters;
    below 1 for model-free drafters that often find nothing to propose). Uses every round."""
    rounds = list(rounds)
    out = []
    for i in range(1, max_position + 1):
        asked = [rd for rd in rounds if isinstance(rd.gamma, int) and rd.gamma >= i]
        out.append(sum(rd.proposed >= i for rd in asked) / len(asked) if asked else math.nan)
    return out


def round_stats(records: Sequence[RequestRecord]) -> dict[str, object]:
    """Acceptance and round-time ledger of one scenario (see module docstring for definitions)."""
    rounds = all_rounds(records)
    full = full_rounds(rounds)
    proposing = [rd for rd in full if rd.proposed > 0]
    chain = conditional_acceptance(rounds)
    chain_a = chain_values(chain)

    def mean_ms(rs: list[RoundRecord], attr: str) -> float:
        return float(np.mean([getattr(rd, attr) for rd in rs]) * MS) if rs else math.nan

    proposed_total = sum(rd.proposed for rd in proposing)
    accepted_total = sum(rd.accepted for rd in proposing)
    return {
        "rounds": len(rounds),
        "full_rounds": len(full),
        "truncated_rounds": len(rounds) - len(full),
        "zero_proposal_rounds": sum(rd.proposed == 0 for rd in full),
        "committed_in_rounds": int(sum(rd.committed for rd in rounds)),
        "el_full": sum(rd.committed for rd in full) / len(full) if full else math.nan,
        "el_proposing": sum(rd.committed for rd in proposing) / len(proposing) if proposing else math.nan,
        "el_all_rounds": sum(rd.committed for rd in rounds) / len(rounds) if rounds else math.nan,
        "el_chain": expected_length_from_chain(chain_a) if chain_a else math.nan,
        "mean_proposed": proposed_total / len(full) if full else math.nan,
        "acceptance_rate": accepted_total / proposed_total if proposed_total else math.nan,
        "conditional_acceptance": chain,
        "k_histogram": k_histogram(rounds),
        "t_draft_ms": mean_ms(full, "t_draft"),
        "t_verify_ms": mean_ms(full, "t_verify"),
        "t_other_ms": mean_ms(full, "t_other"),
        "t_round_ms": mean_ms(full, "t_round"),
        "t_round_all_ms": mean_ms(rounds, "t_round"),
        "round_time_s": float(sum(rd.t_round for rd in rounds)),
        "prefill_time_s": float(sum(r.t_prefill for r in records)),
        "mean_context_len": float(np.mean([rd.context_len for rd in rounds])) if rounds else math.nan,
    }


def chunk_emission_times(token_times: Sequence[float], chunks: Sequence[int]) -> list[float]:
    """Time each chunk left (= emission time of its last token). Falls back to one chunk per
    token when ``chunks`` does not add up to the token times."""
    if chunks and sum(chunks) == len(token_times) and all(c > 0 for c in chunks):
        ends = np.cumsum(chunks) - 1
        return [float(token_times[i]) for i in ends]
    return [float(t) for t in token_times]


def token_gaps(token_times: Sequence[float]) -> list[float]:
    """Token-level ITL: the gaps between consecutive token emission times. Tokens that left in one
    chunk share its time, so a chunk of n tokens after a gap g gives g then n-1 zeros; a request of
    N tokens gives N-1 gaps summing to t_last - t_first (their mean is the pooled TPOT)."""
    return np.diff(np.asarray(token_times, dtype=float)).tolist() if len(token_times) > 1 else []


def chunk_gaps(token_times: Sequence[float], chunks: Sequence[int]) -> list[float]:
    """Chunk-level ITL: the gaps between consecutive chunks (what a streaming client waits between
    updates; ``vllm bench serve``'s ITL)."""
    return np.diff(chunk_emission_times(token_times, chunks)).tolist()


def tpot(first_token_s: float, last_token_s: float, tokens: int) -> float | None:
    """Time per output token after the first: (t_last − t_first) / (tokens − 1); None below two
    tokens or when the times are out of order."""
    if tokens < 2 or last_token_s < first_token_s:
        return None
    return (last_token_s - first_token_s) / (tokens - 1)


def quantile_sketch(values: Sequence[float], scale: float = 1.0, points: int = 101, digits: int = 4) -> list[float]:
    """The sample's (linear-interpolation) quantiles at ``m = min(n, points)`` evenly spaced probabilities
    0, 1/(m-1), .., 1, times ``scale``, each to ``digits`` significant digits: an ECDF in at most ``points``
    numbers. For n <= points that is the sorted sample itself (quantile i/(n-1) is the i-th smallest value), so
    a small sample is kept as it is, not as ``points`` interpolations of it; 4 digits is 0.01 % of a time."""
    if len(values) == 0:
        return []
    qs = np.linspace(0.0, 1.0, min(len(values), points))
    return [float(f"{q:.{digits}g}") for q in np.quantile(np.asarray(values, dtype=float), qs) * scale]


def latency_stats(records: Sequence[RequestRecord]) -> dict[str, object]:
    """TTFT, TPOT, token- and chunk-level ITL, longest stall and tokens per chunk (ms).

    TPOT per request = (total_time − TTFT) / (output_tokens − 1). Token ITL includes the
    zero gaps inside a chunk; chunk ITL is what a streaming client waits between updates.
    Longest stall = largest chunk gap after the first token, over all requests.
    """
    ttft, tpots, itl_token, itl_chunk, per_chunk, stalls = [], [], [], [], [], []
    for r in records:
        ttft.append(r.ttft)
        if (per_token := tpot(r.ttft, r.total_time, r.output_tokens)) is not None:
            tpots.append(per_token)
        itl_token.extend(token_gaps(r.token_times))
        gaps = chunk_gaps(r.token_times, r.chunks)
        itl_chunk.extend(gaps)
        if gaps:
            stalls.append(max(gaps))
        per_chunk.extend(r.chunks if r.chunks else [1] * len(r.token_times))
    return {
        "ttft_ms": distribution(ttft, MS),
        "tpot_ms": distribution(tpots, MS),
        "itl_token_ms": distribution(itl_token, MS),
        "itl_chunk_ms": distribution(itl_chunk, MS),
        "tokens_per_chunk": distribution(per_chunk),
        "longest_stall_ms": max(stalls) * MS if stalls else None,
        "ecdf_ms": {
            "ttft": quantile_sketch(ttft, MS),
            "tpot": quantile_sketch(tpots, MS),
            "itl_chunk": quantile_sketch(itl_chunk, MS),
        },
    }
