"""The paired tests between settings that the verdict reads (:mod:`specledger.analysis.paired`): each setting's S
against plain (:func:`interval_vs_plain`), two settings' ratio S_a / S_b (:func:`compare_settings`), and what an
interval says -- whether S pays against plain (:func:`against_plain`), whether one setting is within the margin of
another or proven faster than plain through one that pays (:class:`PairedIntervals`), how many prompts would settle
an open ratio (:func:`prompts_to_settle`).

Scenario dicts carry ``per_prompt`` (:func:`specledger.analysis.run.analyze_scenario`); without it (simulated
loads, hand-built dicts) the given ``speedup_ci`` is used and settings compare by non-overlapping intervals only
(no equivalence)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specledger.analysis.paired import PerPrompt, RatioInterval, setting_ratio, speedup_interval
from specledger.analysis.sequential import cs_multiplier
from specledger.gates.candidates import Candidate
from specledger.gates.slo import SLO

#: fewest paired prompts behind an equivalence ("within the margin", "no practical gain"). The confidence sequence
#: (:mod:`specledger.analysis.sequential`) already holds at every look and is unbounded below 4 prompts; its exactness
#: at few prompts assumes normal per-prompt ratios, and 2-5 prompts are too few to show one odd prompt among them,
#: so a claim that two figures are *close* waits for 6 (docs/decisions.md)
MIN_EQUIVALENCE_PROMPTS = 6

#: S against plain (:func:`against_plain`): interval above ``min_ci_low`` / cannot be more than the margin faster
#: than plain / below 1 / none of these yet
PAYS, NO_GAIN, SLOWER_THAN_PLAIN, UNSETTLED = "pays", "no gain", "slower", "open"


def interval_vs_plain(s: Candidate, alpha: float) -> RatioInterval:
    """S with its 1 − α interval: from the paired per-prompt totals when the scenario has them, else the
    scenario's own ``speedup_ci`` as given."""
    pp = s.get("per_prompt")
    if pp and pp.get("prompts"):
        spec = PerPrompt.from_dict(pp)
        base = PerPrompt.from_dict({"prompts": pp["prompts"], "tokens": pp.get("base_tokens"),
                                    "seconds": pp.get("base_seconds")})
        iv = speedup_interval(spec, base, alpha)
        if math.isfinite(iv.ratio):
            return RatioInterval(float(s["speedup"]), iv.lo, iv.hi, iv.n)
    lo, hi = s.get("speedup_ci") or (None, None)
    n = int(s.get("paired_prompts") or 0)
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return RatioInterval(float(s["speedup"]), lo if ok else -math.inf, hi if ok else math.inf, n)


def compare_settings(a: Candidate, b: Candidate, ia: RatioInterval, ib: RatioInterval,
                     alpha: float) -> RatioInterval:
    """S_a / S_b paired on the prompts both ran; without per-prompt totals, the ratio of the points with an
    interval only when the two intervals do not overlap (then it excludes 1), else unbounded."""
    pa, pb = a.get("per_prompt"), b.get("per_prompt")
    if pa and pb and pa.get("prompts") and pb.get("prompts"):  # on every prompt both ran, plain or not
        return setting_ratio(PerPrompt.from_dict(pa.get("own") or pa), PerPrompt.from_dict(pb.get("own") or pb),
                             alpha)
    ratio = ia.ratio / ib.ratio if ib.ratio else math.nan
    if ia.lo > ib.hi and ib.hi > 0:
        return RatioInterval(ratio, ia.lo / ib.hi, math.inf, min(ia.n, ib.n))
    if ia.hi < ib.lo and ib.lo > 0:
        return RatioInterval(ratio, 0.0, ia.hi / ib.lo, min(ia.n, ib.n))
    return RatioInterval(ratio, -math.inf, math.inf, min(ia.n, ib.n))


def format_ci(iv: RatioInterval) -> str:
    """"1.02–1.17", or "no interval" where either end is unbounded."""
    if not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
        return "no interval"
    return f"{iv.lo:.2f}–{iv.hi:.2f}"


def lower_bound(iv: RatioInterval) -> float:
    """The interval's lower end, −∞ where it is NaN."""
    return iv.lo if not math.isnan(iv.lo) else -math.inf


def enough_prompts(iv: RatioInterval) -> bool:
    """Enough paired prompts for an equivalence (:data:`MIN_EQUIVALENCE_PROMPTS`); ``n`` 0 is an interval given
    whole (a scenario without per-prompt totals, an import), taken as it is."""
    return iv.n == 0 or iv.n >= MIN_EQUIVALENCE_PROMPTS


def against_plain(iv: RatioInterval, slo: SLO) -> str:
    """S against plain: :data:`PAYS` (interval above min_ci_low), :data:`NO_GAIN` (its upper bound below
    1 + margin: it cannot be worth more than the margin), :data:`SLOWER_THAN_PLAIN` (interval below 1),
    :data:`UNSETTLED`."""
    if iv.hi < 1.0:
        return SLOWER_THAN_PLAIN
    if iv.hi < 1.0 + slo.equivalence_margin and enough_prompts(iv):
        return NO_GAIN
    if iv.lo > slo.min_ci_low:
        return PAYS
    return UNSETTLED


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


@dataclass(frozen=True)
class PairedIntervals:
    """The intervals of one group's settings, keyed by the scenario dicts' identity: each one's S against plain
    (``vs_plain``) and every ordered pair's S_x / S_y (``ratios``)."""

    vs_plain: Mapping[int, RatioInterval]
    ratios: Mapping[tuple[int, int], RatioInterval]

    def plain(self, x: Candidate) -> RatioInterval:
        """S_x against plain."""
        return self.vs_plain[id(x)]

    def ratio(self, x: Candidate, y: Candidate) -> RatioInterval:
        """S_x / S_y, paired."""
        return self.ratios[(id(x), id(y))]

    def pays(self, x: Candidate, slo: SLO) -> str:
        """:func:`against_plain` of S_x."""
        return against_plain(self.plain(x), slo)

    def within_margin(self, x: Candidate, y: Candidate, margin: float) -> bool:
        """``y`` cannot be more than the margin faster than ``x``: paired, lo(S_x / S_y) > 1/(1+m); or through
        plain, hi(S_y) / lo(S_x) < 1 + m (a setting that cannot beat plain by much cannot beat one that pays).
        Either on enough prompts (:func:`enough_prompts`)."""
        xy = self.ratio(x, y)
        if enough_prompts(xy) and lower_bound(xy) > 1.0 / (1.0 + margin):
            return True
        ix, iy = self.plain(x), self.plain(y)
        return (enough_prompts(ix) and enough_prompts(iy) and lower_bound(ix) > 0 and math.isfinite(iy.hi)
                and iy.hi / lower_bound(ix) < 1.0 + margin)

    def proven_to_pay(self, x: Candidate, paying: Sequence[Candidate], slo: SLO) -> bool:
        """``x`` is proven faster than plain: its own paired interval against plain pays, or, through a setting
        ``y`` that pays, ``lo(S_y) · lo(S_x / S_y) > min_ci_low`` (each bound wrong at some look of the race with
        probability at most α: the chained bound holds at 2α at worst). A setting the rule would pick for being
        within the margin of the best is deployed only once it is shown to beat plain itself."""
        if self.pays(x, slo) == PAYS:
            return True
        return any(self.chained_bound(x, y) > slo.min_ci_low for y in paying if y is not x)

    def chained_bound(self, x: Candidate, via: Candidate) -> float:
        """lo(S_via) · lo(S_x / S_via): a lower bound on S_x through ``via``."""
        return lower_bound(self.plain(via)) * lower_bound(self.ratio(x, via))


__all__ = ["MIN_EQUIVALENCE_PROMPTS", "NO_GAIN", "PAYS", "SLOWER_THAN_PLAIN", "UNSETTLED", "PairedIntervals",
           "against_plain", "compare_settings", "enough_prompts", "format_ci", "interval_vs_plain", "lower_bound",
           "prompts_to_settle"]
