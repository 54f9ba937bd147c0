"""The verdict's rules, one setting or interval at a time: which gates block (:func:`_blocking`, with the
SLO's margin: :func:`_marginally_blocked`), whether S pays against plain (:func:`_pays`), whether one
setting is within the margin of another (:func:`_within_margin`) or proven faster than plain through one
that pays (:func:`_proven_to_pay`), when requests are too thin to decide (:func:`_too_thin`), the tie rule's
order (:func:`memory_key`), how many prompts would settle an open comparison, and the controls' repetition.
:mod:`specledger.gates.verdicts` applies them to a group."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from specledger.analysis.paired import RatioInterval
from specledger.analysis.sequential import cs_multiplier
from specledger.gates.result import FAIL, GATES, NOT_ASSESSED
from specledger.gates.slo import SLO
from specledger.records import RequestRecord

#: fewest paired prompts behind an equivalence ("within the margin", "no practical gain"). The confidence sequence
#: (:mod:`specledger.analysis.sequential`) already holds at every look and is unbounded below 4 prompts; its exactness
#: at few prompts assumes normal per-prompt ratios, and 2-5 prompts are too few to show one odd prompt among them,
#: so a claim that two figures are *close* waits for 6 (docs/decisions.md)
MIN_EQUIVALENCE_PROMPTS = 6
#: categories that are controls, never deployed: they show what the drafters do on input without structure
CONTROL_CATEGORIES = frozenset({"random"})
#: memory rank of a drafter's own state (weights, KV): model-free < shared weights < int8 copy < separate model
DRAFTER_MEMORY_RANK = {"ngram": 0, "suffix": 1, "layerskip": 2, "head": 3, "quant-self": 4, "model": 5}
#: below this many full speculative rounds per request (best setting) a category's rounds say nothing
MIN_ROUNDS_PER_REQUEST = 2.0
#: below this many output tokens per request (best setting) the time compared is mostly the prefill
MIN_TOKENS_PER_REQUEST = 4.0


def _blocking(gates: dict[str, dict[str, str]], slo: SLO) -> list[str]:
    bad = {FAIL, NOT_ASSESSED} if slo.require_assessed else {FAIL}
    return [name for name in GATES if gates.get(name, {}).get("status", NOT_ASSESSED) in bad]


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


def memory_key(s: Mapping[str, Any]) -> tuple:
    """The tie rule's order: cheaper drafter state first, then the smaller γ."""
    g = s["gamma"] if isinstance(s["gamma"], (int, float)) else math.inf
    return (DRAFTER_MEMORY_RANK.get(s["drafter"], 9), g)


def setting_name(s: Mapping[str, Any]) -> str:
    return f"{s['drafter']} γ={s['gamma']}" + (f" tree={s['tree_budget']}" if s.get("tree_budget") else "")


def _fmt_ci(iv: RatioInterval) -> str:
    if not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
        return "no interval"
    return f"{iv.lo:.2f}–{iv.hi:.2f}"


def prompts_to_separate(a: dict[str, Any], b: dict[str, Any] | None = None, threshold: float = 1.0) -> int | None:
    """Paired prompts that would make the intervals of ``a`` and ``b`` (or ``a`` and ``threshold``) stop
    overlapping, if the half-widths shrink as 1/sqrt(n) and the point estimates stay put."""
    n = max(int(a.get("paired_prompts") or 1), 1)

    def half(s: dict[str, Any]) -> float | None:
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


def prompts_to_settle(iv: RatioInterval, margin: float, alpha: float = 0.05) -> int | None:
    """Paired prompts that would settle an open ratio, if the per-prompt spread and the ratio stay put: the
    smallest k with ``m_k · sd / √k`` below the room left (the interval excludes 1, or fits inside the margin),
    where ``sd = half · √n / m_n`` is the spread behind the interval's log half-width now and ``m_k`` the
    confidence sequence's multiplier (:func:`~specledger.analysis.sequential.cs_multiplier`; a fixed point, since
    ``m_k`` moves slowly with k)."""
    if iv.n < 2 or not (math.isfinite(iv.lo) and math.isfinite(iv.hi) and iv.ratio > 0 and iv.lo > 0):
        return None
    half = (math.log(iv.hi) - math.log(iv.lo)) / 2
    room = max(abs(math.log(iv.ratio)), math.log(1 + margin) - abs(math.log(iv.ratio)))
    now = cs_multiplier(iv.n, alpha)
    if half <= 0 or room <= 0 or not math.isfinite(now):
        return None
    sd, k = half * math.sqrt(iv.n) / now, iv.n + 1
    for _ in range(20):
        m = cs_multiplier(k, alpha)
        nxt = max(iv.n + 1, math.ceil((m * sd / room) ** 2)) if math.isfinite(m) else 2 * k
        if nxt == k:
            break
        k = nxt
    return k


def _marginal(s: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """'latency (TTFT P99)' for each gate in ``names`` whose outcome a rerun could flip."""
    out = []
    for name in names:
        checks = s["gates"].get(name, {}).get("marginal") or []
        if checks:
            out.append(f"{name} ({', '.join(checks)})")
    return out


def _marginally_blocked(s: Mapping[str, Any], slo: SLO) -> list[str]:
    """The blocking gates of ``s`` when every one of them fails only within the SLO's margin (else [])."""
    blocked = _blocking(s["gates"], slo)
    flips = _marginal(s, blocked)
    return flips if blocked and len(flips) == len(blocked) else []


def _per_request(s: Mapping[str, Any]) -> tuple[float | None, float | None]:
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


def _too_thin(measured: Sequence[Mapping[str, Any]]) -> str | None:
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


def _pays(iv: RatioInterval, slo: SLO) -> str:
    """S against plain: "pays" (interval above min_ci_low), "no gain" (its upper bound below 1 + margin: it
    cannot be worth more than the margin), "slower" (interval below 1), "open"."""
    if iv.hi < 1.0:
        return "slower"
    if iv.hi < 1.0 + slo.equivalence_margin and _enough(iv):
        return "no gain"
    if iv.lo > slo.min_ci_low:
        return "pays"
    return "open"


def _within_margin(x: Mapping[str, Any], y: Mapping[str, Any], ivs: Mapping[int, RatioInterval],
                   pair: Mapping[tuple[int, int], RatioInterval], margin: float) -> bool:
    """``y`` cannot be more than the margin faster than ``x``: paired, lo(S_x / S_y) > 1/(1+m); or through plain,
    hi(S_y) / lo(S_x) < 1 + m (a setting that cannot beat plain by much cannot beat one that pays). Either on
    enough prompts (:func:`_enough`)."""
    xy = pair[(id(x), id(y))]
    if _enough(xy) and _lo(xy) > 1.0 / (1.0 + margin):
        return True
    ix, iy = ivs[id(x)], ivs[id(y)]
    return (_enough(ix) and _enough(iy) and _lo(ix) > 0 and math.isfinite(iy.hi)
            and iy.hi / _lo(ix) < 1.0 + margin)


def _enough(iv: RatioInterval) -> bool:
    """Enough paired prompts for an equivalence (:data:`MIN_EQUIVALENCE_PROMPTS`); ``n`` 0 is an interval given
    whole (a scenario without per-prompt totals, an import), taken as it is."""
    return iv.n == 0 or iv.n >= MIN_EQUIVALENCE_PROMPTS


def _lo(iv: RatioInterval) -> float:
    return iv.lo if not math.isnan(iv.lo) else -math.inf


def _proven_to_pay(x: dict[str, Any], paying: Sequence[dict[str, Any]], ivs: Mapping[int, RatioInterval],
                   pair: Mapping[tuple[int, int], RatioInterval], slo: SLO) -> bool:
    """``x`` is proven faster than plain: its own paired interval against plain pays, or, through a setting
    ``y`` that pays, ``lo(S_y) · lo(S_x / S_y) > min_ci_low`` (each bound wrong at some look of the race with
    probability at most α: the chained bound holds at 2α at worst). A setting the rule would pick for being
    within the margin of the best is deployed only once it is shown to beat plain itself."""
    if _pays(ivs[id(x)], slo) == "pays":
        return True
    return any(_lo(ivs[id(y)]) * _lo(pair[(id(x), id(y))]) > slo.min_ci_low for y in paying if y is not x)
