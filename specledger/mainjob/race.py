"""Racing: the main job spends its time budget where decisions are still open.

After the initial prompts of every category, the job asks the decision rule
(:func:`specledger.gates.solo.solo_decisions`) which (category, temperature) decisions are open.
For each open one it adds ``step`` more prompts of that category (the bundled datasets have
hundreds; a workload file's unused lines), running plain decoding and only the settings still in
contention -- the leader and every setting whose paired comparison with it is open. A setting whose
paired interval lies below the leader's, or that is slower than plain, or fails a gate, is *dropped*
there and runs no more prompts (its figures so far stay in the trace and the report). The race stops
when every decision is resolved, the prompt pools are exhausted, or the budget is spent; a prompt
group is only started when its estimated time (the median of that category's groups so far) fits.

Looking after every round costs the decisions nothing in validity: every interval they read is a confidence
sequence (:mod:`specledger.analysis.sequential`), so over a whole race, however many rounds it runs and whenever it
stops, each call is wrong with probability at most ``decision_alpha`` (docs/decisions.md, "The paired test").

The race's log (rounds, drops, why it stopped) goes into ``run.json`` under ``race`` and from there
into ``summary.json``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeVar

from specledger.gates.decision import CONTROL, NO_DECISION, Comparison, Verdict, VerdictDict, as_verdict
from specledger.records import GammaSpec, setting_label

if TYPE_CHECKING:
    from specledger.gates.slo import SLO
    from specledger.records import RequestRecord

#: prompts added to an open category per race round
RACE_STEP = 2
#: a category's prompts never exceed this many in a race (a decision that needs more is left open)
MAX_PROMPTS_PER_CATEGORY = 48

#: a decision as the race reads it: typed, or as the rule wrote it (``probe --budget`` passes its own)
AnyVerdict = TypeVar("AnyVerdict", Verdict, VerdictDict)


@dataclass(frozen=True)
class Setting:
    """A speculative configuration of the plan, the key a decision names it by: (drafter, γ, tree budget)."""

    drafter: str
    gamma: GammaSpec  # draft length, or the name of the adaptive policy that picks it per round
    tree_budget: int = 0  # token-tree nodes per round (0: a chain)

    @property
    def name(self) -> str:
        """The label the decisions use for it: "ngram γ=4", "ngram γ=4 tree=16" (:func:`setting_label`)."""
        return setting_label(self.drafter, self.gamma, self.tree_budget)

    @classmethod
    def parse(cls, name: str) -> Setting | None:
        """The setting a decision's label names ("ngram γ=4", "ngram γ=4 tree=16", "ngram γ=heuristic"); None
        for one that names no setting ("off", "plain", "control")."""
        drafter, named, rest = name.partition(" γ=")
        gamma, treed, tree = rest.partition(" tree=")
        if not named or not drafter or not gamma or (treed and not tree.isdigit()):
            return None
        return cls(drafter, int(gamma) if gamma.isdigit() else gamma, int(tree) if treed else 0)


class RaceRound(TypedDict):
    """One round of ``specledger run``'s race (``run.json`` ``race.rounds``)."""

    after_s: float  # seconds into the run when it was planned
    category: str  # the open decision's category it added prompts to
    temperature: float
    added_prompts: int
    with_plain: bool  # plain decoding ran the new prompts too (the S against plain was still open)
    settings: list[str]  # the contenders that ran them
    why: str  # the decision's headline: what was open


class ProbeRound(TypedDict):
    """One round of ``specledger probe --budget``'s race: which configuration ran how many prompts."""

    after_s: float  # seconds into the race when it ended
    round: int  # its index (round 0, every configuration on the first prompts, is not logged)
    prompts: dict[str, int]  # configuration -> prompts it ran in this round


class RaceDropped(TypedDict):
    """A setting the race stopped running for one decision (``run.json`` ``race.dropped``)."""

    category: str
    temperature: float
    label: str  # the setting's name ("ngram γ=2")
    after_prompts: int | None  # the category's prompts when it was dropped (None: not recorded)
    after_s: float  # seconds into the race
    why: str  # the paired comparison that put it out, or the plain reason


class RaceLogDict(TypedDict):
    """:meth:`RaceLog.to_dict`: ``run.json``'s ``race`` (``run`` adds ``load_point_settings``)."""

    budget_s: float
    spent_s: float
    rounds: list[RaceRound | ProbeRound]
    dropped: list[RaceDropped]
    stopped: str


@dataclass
class RaceLog:
    """What the race did: every round, every drop, and why it stopped."""

    budget_s: float
    started: float = field(default_factory=time.monotonic)
    rounds: list[RaceRound | ProbeRound] = field(default_factory=list)
    dropped: list[RaceDropped] = field(default_factory=list)
    stopped: str = ""
    #: the decisions as the race left them (what the load points after it keep)
    final: list[Verdict] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def to_dict(self) -> RaceLogDict:
        return {"budget_s": self.budget_s, "spent_s": round(self.elapsed(), 1), "rounds": self.rounds,
                "dropped": self.dropped, "stopped": self.stopped}


def decisions_so_far(records: Sequence[RequestRecord], slo: SLO | None = None) -> list[VerdictDict]:
    """The decisions at load 1 of the records as they stand: the one rule (:func:`specledger.gates.solo.
    solo_decisions`: paired per-prompt comparisons, the equivalence margin, the tie rule) at the SLO's margin
    widened to the records' measured drift, without resampling. What every race reads -- ``specledger run``'s
    and ``specledger probe --budget``'s -- to know which decisions are open and which settings are out."""
    from specledger.gates import SLO, with_measured_margin
    from specledger.gates.solo import solo_decisions

    return solo_decisions(records, with_measured_margin(slo or SLO(), records))


def contenders(verdict: Verdict | VerdictDict) -> list[str]:
    """Setting names still in contention in an open decision: its ``contenders`` (the leader and every
    setting whose comparison with it is open)."""
    return list(as_verdict(verdict).contenders)


def open_decisions(decisions: Sequence[AnyVerdict]) -> list[AnyVerdict]:
    """Decisions a race can still settle: not resolved, neither a control nor a no-decision."""
    return [v for v in decisions if _can_settle(as_verdict(v))]


def _can_settle(v: Verdict) -> bool:
    return not v.resolved and v.decision not in (CONTROL, NO_DECISION) and bool(v.contenders)


def race(
    log: RaceLog,
    deadline: float,
    decide: Callable[[], Sequence[Verdict | VerdictDict]],
    more_prompts: Callable[[str, int], list[str]],
    run_prompts: Callable[[str, float, list[str], list[Setting], bool], None],
    settings: Sequence[Setting],
    prompts_so_far: Callable[[str], int],
    step: int = RACE_STEP,
    max_per_category: int = MAX_PROMPTS_PER_CATEGORY,
    clock: Callable[[], float] = time.monotonic,
) -> RaceLog:
    """Run race rounds until every decision is resolved, nothing can be added, or ``deadline`` (a
    ``clock`` time) is near. ``decide()`` returns the current decisions; ``more_prompts(category, k)``
    the ids of up to k unused prompts of a category (registered for running); ``run_prompts(category,
    temperature, ids, settings, with_plain)`` runs those settings on them, and plain decoding too when the
    decision still needs it (an open S against plain; comparisons between settings need no plain run);
    ``prompts_so_far(category)``
    counts the category's prompts."""
    by_name = {s.name: s for s in settings}
    dropped: set[tuple[str, float, str]] = set()
    exhausted: set[str] = set()
    group_time: dict[str, list[float]] = {}
    while True:
        decisions = [as_verdict(v) for v in decide()]
        log.final = decisions
        todo = [v for v in open_decisions(decisions) if v.category not in exhausted]
        if not todo:
            log.stopped = ("every decision resolved" if not open_decisions(decisions) else
                           "no more prompts in the open categories")
            return log
        note_drops(log, decisions, by_name, dropped, prompts_so_far)
        ran = late = False
        for v in todo:
            cat, temp = v.category, float(v.temperature)
            est = statistics.median(group_time[cat]) if group_time.get(cat) else 0.0
            if clock() + est * step > deadline:
                late = True
                continue
            if prompts_so_far(cat) >= max_per_category:
                exhausted.add(cat)
                continue
            ids = more_prompts(cat, step)
            if not ids:
                exhausted.add(cat)
                continue
            keep = [by_name[n] for n in v.contenders if n in by_name]
            t0 = clock()
            with_plain = v.needs_plain is not False  # an open S against plain, or not said: plain runs too
            run_prompts(cat, temp, ids, keep, with_plain)
            group_time.setdefault(cat, []).append((clock() - t0) / len(ids))
            log.rounds.append(RaceRound(after_s=round(log.elapsed(), 1), category=cat, temperature=temp,
                                        added_prompts=len(ids), with_plain=with_plain,
                                        settings=[s.name for s in keep], why=v.headline))
            ran = True
        if late and not ran:
            log.stopped = "budget spent"
            return log


def note_drops(log: RaceLog, decisions: Sequence[Verdict | VerdictDict], by_name: Collection[str],
               dropped: set[tuple[str, float, str]], prompts_so_far: Callable[[str], int]) -> None:
    """Log every setting (of ``by_name``) of an open decision that is no longer a contender, once."""
    for v in open_decisions([as_verdict(d) for d in decisions]):
        keep = set(v.contenders)
        cmp = {c.b: c for c in v.comparisons}
        for name in by_name:
            key = (v.category, float(v.temperature), name)
            if name in keep or key in dropped:
                continue
            dropped.add(key)
            log.dropped.append(RaceDropped(category=v.category, temperature=v.temperature, label=name,
                                           after_prompts=prompts_so_far(v.category),
                                           after_s=round(log.elapsed(), 1), why=_drop_reason(v, cmp.get(name))))


def _drop_reason(v: Verdict, c: Comparison | None) -> str:
    """Why a setting left the race: the leader's paired comparison with it, when it has a lower bound."""
    lo = c.ci[0] if c else None
    if c and isinstance(lo, (int, float)):
        return (f"cannot be more than the margin faster than {v.setting} (paired ratio "
                f"{c.ratio:.3f}, lower bound {lo:.3f})")
    return "slower than plain, no practical gain, or fails a gate"


__all__ = ["MAX_PROMPTS_PER_CATEGORY", "RACE_STEP", "ProbeRound", "RaceDropped", "RaceLog", "RaceLogDict",
           "RaceRound", "Setting", "contenders", "decisions_so_far", "note_drops", "open_decisions", "race"]
