"""The verdict's settings and thresholds: a setting's name (:func:`setting_name`), the tie rule's order
(:func:`memory_key`), when requests are too thin to decide (:func:`too_thin`), the controls and their repetition
(:func:`control_repetition`), and how many prompts would separate two intervals (:func:`prompts_to_separate`).
The paired tests live in :mod:`specledger.gates.paired_tests`, the gates that block in
:mod:`specledger.gates.blocking`; :mod:`specledger.gates.verdicts` applies them to a group."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from specledger.engine.drafters.catalog import memory_ranks
from specledger.gates.candidates import Candidate
from specledger.gates.paired_tests import MIN_EQUIVALENCE_PROMPTS, prompts_to_settle
from specledger.records import RequestRecord

#: categories that are controls, never deployed: they show what the drafters do on input without structure
CONTROL_CATEGORIES = frozenset({"random"})
#: memory rank of a drafter's own state (weights, KV): model-free < shared weights < int8 copy < separate model
DRAFTER_MEMORY_RANK = memory_ranks()
#: below this many full speculative rounds per request (best setting) a category's rounds say nothing
MIN_ROUNDS_PER_REQUEST = 2.0
#: below this many output tokens per request (best setting) the time compared is mostly the prefill
MIN_TOKENS_PER_REQUEST = 4.0


def repeated_ngram_fraction(token_ids: Sequence[int], n: int = 4) -> float | None:
    """Share of an output's n-grams that already occurred earlier in it (None when shorter than n + 1)."""
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    if len(grams) < 2:
        return None
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def control_repetition(records: Sequence[RequestRecord], n: int = 4) -> dict[tuple[str, float], float]:
    """Mean repeated-n-gram fraction of plain decoding's outputs per control (category, temperature)."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in records:
        if r.category in CONTROL_CATEGORIES and (r.drafter or "none") == "none":
            if (f := repeated_ngram_fraction(r.token_ids, n)) is not None:
                acc[(r.category, float(r.temperature))].append(f)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def memory_key(s: Candidate) -> tuple[int, float]:
    """The tie rule's order: cheaper drafter state first, then the smaller γ."""
    g = s["gamma"] if isinstance(s["gamma"], (int, float)) else math.inf
    return (DRAFTER_MEMORY_RANK.get(s["drafter"], 9), g)


def setting_name(s: Candidate) -> str:
    """"ngram γ=4", with " tree=B" for a tree."""
    return f"{s['drafter']} γ={s['gamma']}" + (f" tree={s['tree_budget']}" if s.get("tree_budget") else "")


def prompts_to_separate(a: Candidate, b: Candidate | None = None, threshold: float = 1.0) -> int | None:
    """Paired prompts that would make the intervals of ``a`` and ``b`` (or ``a`` and ``threshold``) stop
    overlapping, if the half-widths shrink as 1/sqrt(n) and the point estimates stay put."""
    n = max(int(a.get("paired_prompts") or 1), 1)

    def half(s: Candidate) -> float | None:
        lo, hi = s["speedup_ci"]
        return None if lo is None or hi is None else (hi - lo) / 2

    ha = half(a)
    if ha is None:
        return None
    if b is None:
        gap, width = abs(a["speedup"] - threshold), ha
    else:
        hb = half(b)
        if hb is None:
            return None
        gap, width = abs(a["speedup"] - b["speedup"]), ha + hb
    if not (math.isfinite(gap) and math.isfinite(width)) or gap <= 0:
        return None
    return max(n + 1, math.ceil(n * (width / gap) ** 2))


def _per_request(s: Candidate) -> tuple[float | None, float | None]:
    """(full speculative rounds, output tokens) per request of a scenario; rounds None when the records
    carry no rounds at all (an endpoint probe reports tokens, not rounds)."""
    rounds, totals = s.get("rounds") or {}, s.get("totals") or {}
    requests = float(totals.get("requests") or 0)
    if not requests:
        return None, None
    tokens = float(totals.get("tokens") or 0) / requests
    full, any_rounds = rounds.get("full_rounds"), rounds.get("rounds")
    if not isinstance(full, (int, float)) or (not any_rounds and tokens >= MIN_TOKENS_PER_REQUEST):
        return None, tokens
    return float(full) / requests, tokens


def too_thin(measured: Sequence[Candidate]) -> str | None:
    """Why nothing can be decided from these requests (None when they are enough): even the best setting
    ran fewer than :data:`MIN_ROUNDS_PER_REQUEST` full speculative rounds per request, or its replies
    averaged fewer than :data:`MIN_TOKENS_PER_REQUEST` tokens (what is timed then is the prefill)."""
    facts = [_per_request(s) for s in measured]
    rounds = [r for r, _ in facts if r is not None]
    tokens = [t for _, t in facts if t is not None]
    if not tokens:
        return None
    if max(tokens) >= MIN_TOKENS_PER_REQUEST and (not rounds or max(rounds) >= MIN_ROUNDS_PER_REQUEST):
        return None
    return (f"too few speculative rounds to measure anything ({max(rounds, default=0.0):.1f} full rounds, "
            f"{max(tokens):.1f} output tokens per request): the replies end at their first tokens; give the "
            "prompts as chat `messages` (an instruct model answers raw text with EOS) or raise --max-tokens")


__all__ = ["CONTROL_CATEGORIES", "DRAFTER_MEMORY_RANK", "MIN_EQUIVALENCE_PROMPTS", "MIN_ROUNDS_PER_REQUEST",
           "MIN_TOKENS_PER_REQUEST", "control_repetition", "memory_key", "prompts_to_separate", "prompts_to_settle",
           "repeated_ngram_fraction", "setting_name", "too_thin"]
