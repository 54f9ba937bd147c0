"""Which ending a group's decision takes (indifference-zone selection), from the paired intervals of its settings
that pass every gate: a resolved deploy of the rule's pick, resolved off, or open on the settings still
contending (:func:`resolve`). The words of each ending are :mod:`specledger.gates.causes`'.

A setting is *safe* when no other eligible setting can be more than the margin m faster: for every other b the
lower bound of S_s / S_b exceeds 1/(1+m), paired, or, through plain, hi(S_b) / lo(S_s) < 1 + m. The decision is
resolved when some setting pays and some safe setting is faster than plain (the rule picks among the safe ones
faster than plain: all are within m of the best), or when no eligible setting can be more than m faster than
plain (off). Otherwise it is open, with the leader and every setting that could still beat it by more than m as
the contenders (the race runs those)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specledger.gates.blocking import marginally_blocked
from specledger.gates.candidates import Candidate
from specledger.gates.decision import DEPLOY, OFF, OPEN
from specledger.gates.paired_tests import NO_GAIN, PAYS, SLOWER_THAN_PLAIN, PairedIntervals
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import memory_key


@dataclass(frozen=True)
class Ending:
    """How a group's decision ends, before it is put in words."""

    kind: str  # DEPLOY (resolved), OFF (resolved) or OPEN
    focus: Candidate  # DEPLOY: the pick; OFF: the leader; OPEN: the setting whose place is unsettled
    leader: Candidate  # the fastest paying setting (or the fastest eligible one when none pays)
    pays: bool = False  # OPEN: ``focus`` is shown to pay against plain
    provisional: Candidate | None = None  # OPEN: the provisional deploy when it is not ``focus``'s own S
    unproven: bool = False  # OPEN: ``focus`` is within the margin of every setting, not yet shown above plain
    hinge: tuple[Candidate, ...] = ()  # faster settings that fail a gate only within the SLO's margin: open


def _faster_and_marginal(measured: Sequence[Candidate], eligible: Sequence[Candidate], leader: Candidate,
                         iv: PairedIntervals, slo: SLO) -> tuple[Candidate, ...]:
    """The settings faster than ``leader`` that fail a gate only within the SLO's margin and are not slower than
    plain: a rerun could pass them, so the decision hinges on them."""
    return tuple(x for x in measured if x not in eligible and x["speedup"] > leader["speedup"]
                 and marginally_blocked(x, slo) and iv.pays(x, slo) != SLOWER_THAN_PLAIN)


def resolve(measured: Sequence[Candidate], eligible: Sequence[Candidate], iv: PairedIntervals, slo: SLO) -> Ending:
    """The ending of a group whose ``eligible`` settings (those of ``measured`` that pass every gate; at least
    one) have the paired intervals ``iv``."""
    margin = slo.equivalence_margin

    def safe(x: Candidate) -> bool:
        return all(iv.within_margin(x, y, margin) for y in eligible if y is not x)

    def beaten_by_more_than_margin(x: Candidate, y: Candidate) -> bool:
        """``y`` is proven more than the margin faster than ``x``: hi(S_x / S_y) < 1/(1+m). Only such an ``x``
        is passed over: one merely slower, but possibly within the margin, keeps the decision open, so two runs
        do not pass it over in one and pick it in the other."""
        return iv.ratio(x, y).hi < 1.0 / (1.0 + margin)

    paying = [x for x in eligible if iv.pays(x, slo) == PAYS]
    leader = max(paying or eligible, key=lambda x: x["speedup"])  # a faster point that may not pay contends
    hinge = _faster_and_marginal(measured, eligible, leader, iv, slo)
    # The target is reproducible: the rule's first setting (cheaper in memory, then smaller γ) among those within
    # the margin of the best. Walk the settings faster than plain in the rule's order: the first one that is safe
    # (and shown to beat plain) is the pick; one proven more than the margin slower than another setting is passed
    # over; one that is neither keeps the decision open (a rerun could pick it or pass it: the race measures it).
    undecided, unproven = None, False
    if paying:
        for x in sorted((x for x in eligible if x["speedup"] > 1.0), key=lambda x: (*memory_key(x), -x["speedup"])):
            if safe(x) and iv.proven_to_pay(x, paying, slo):
                return Ending(DEPLOY, x, leader, hinge=hinge)
            if any(beaten_by_more_than_margin(x, y) for y in eligible if y is not x):
                continue
            undecided, unproven = x, safe(x)  # safe but not yet proven faster than plain: measure it with plain
            break
    if all(iv.pays(x, slo) in (NO_GAIN, SLOWER_THAN_PLAIN) for x in eligible):
        return Ending(OFF, leader, leader, hinge=hinge)
    if undecided is not None and (undecided is not leader or unproven):
        return Ending(OPEN, undecided, leader, pays=iv.pays(undecided, slo) == PAYS, provisional=leader,
                      unproven=unproven, hinge=hinge)
    return Ending(OPEN, leader, leader, pays=bool(paying) and leader in paying, hinge=hinge)


__all__ = ["Ending", "resolve"]
