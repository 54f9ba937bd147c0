"""The verdict as a type: one decision per (category, temperature) at one load, what
:func:`specledger.gates.verdicts.verdicts` decides and ``summary.json`` carries under ``verdicts`` (and ``mix``).

:class:`Verdict` holds every key a verdict carries; :meth:`Verdict.to_dict` gives the JSON-ready dict
(:class:`VerdictDict`) with exactly the keys it had before this type existed -- a key that only some verdicts
carry (``needs_plain``, ``shown_through``, ``context_bucket``, ``load`` ...) stays absent where it is None -- in
the same order, and :meth:`Verdict.from_dict` reads one back (``from_dict(d).to_dict() == d`` for every verdict
the rule writes). A hand-built dict may leave keys out: each reads as its field's default.

The same plain dataclasses are ``summary.json``'s verdict type: the report reads the file through them with
pydantic and generates the file's JSON Schema from them (:mod:`specledger.report.summary_verdicts`), so each
field's docstring is its key's description there, and a field is Optional wherever the file may hold null (JSON
writes NaN and infinity as null) or a summary written before the key existed lacks it.

Decisions: :data:`DEPLOY`, :data:`OFF`, :data:`CONTROL`, :data:`NO_DECISION`. Resolutions: :data:`WINNER`,
:data:`BY_EQUIVALENCE`, :data:`OFF`, :data:`OPEN`, :data:`NO_DATA`, :data:`CONTROL`. Torch-free, pydantic-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from specledger.workloads.context_buckets import Bucket

#: the decision: deploy a setting / speculation off / a control, never deployed / nothing measurable
DEPLOY, OFF, CONTROL, NO_DECISION = "deploy", "off", "control", "no-decision"
Decision = Literal["deploy", "off", "control", "no-decision"]
#: how it was reached: the chosen setting beats every other (or is the only one that passes the gates) /
#: chosen by the rule among settings within the margin / ``OFF`` / still ``OPEN`` / ``NO_DATA`` / ``CONTROL``
WINNER, BY_EQUIVALENCE, OPEN, NO_DATA = "winner", "equivalent", "open", "no-data"
Resolution = Literal["winner", "equivalent", "off", "open", "no-data", "control"]
#: a paired comparison's outcome (:mod:`specledger.analysis.paired`)
PairedVerdict = Literal["a faster", "b faster", "equivalent", "open"]

#: a 1 − α interval as written: (lo, hi), None where unbounded or unknown
Interval = tuple[float | None, float | None]


def interval_of(lo: float, hi: float) -> Interval:
    """(lo, hi) with an unbounded (infinite or NaN) end as None, as the verdict writes its intervals."""
    return (lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None)


def _pair(values: Sequence[float | None] | None) -> Interval:
    lo, hi = values if values else (None, None)
    return lo, hi


class ComparisonDict(TypedDict):
    a: str
    b: str
    ratio: float | None
    ci: list[float | None]
    n: int | None
    verdict: PairedVerdict


@dataclass(frozen=True)
class Comparison:
    """One paired comparison of two settings: the ratio of their speed-ups on the same prompts (the leader
    against one other eligible setting)."""

    a: str
    """Setting a, the leader ("suffix γ=4")."""
    b: str
    """Setting b."""
    ratio: float | None
    """S_a / S_b, paired; unknown: NaN as the rule computes it, null in the file (None read back)."""
    ci: Interval
    """Its 1 − α confidence-sequence interval (null where unbounded)."""
    n: int | None
    """Paired prompts behind it (absent from summaries written before the key: read as None)."""
    verdict: PairedVerdict
    """"equivalent": the interval lies inside [1/(1+m), 1+m] (TOST, m = slo.equivalence_margin); "a faster" /
    "b faster": it excludes 1; else "open"."""

    @classmethod
    def from_dict(cls, d: ComparisonDict) -> Comparison:
        return cls(d["a"], d["b"], d["ratio"], _pair(d.get("ci")), d.get("n"), d["verdict"])

    def to_dict(self) -> ComparisonDict:
        return {"a": self.a, "b": self.b, "ratio": self.ratio, "ci": list(self.ci), "n": self.n,
                "verdict": self.verdict}


class ShownThroughDict(TypedDict):
    setting: str
    bound: float
    level: float
    text: str


@dataclass(frozen=True)
class ShownThrough:
    """A deploy whose own S interval does not clear ``min_ci_low``, shown faster than plain through a setting
    that pays (and clears it): lo(S_via) · lo(S_chosen / S_via)."""

    setting: str
    """The setting it is shown through."""
    bound: float
    """lo(S_setting) · lo(paired ratio): the chained lower bound on S."""
    level: float
    """The chained bound's confidence level (0.9 = 90 %), 1 − 2·decision_alpha at worst."""
    text: str
    """The same in words, as the answer shows it."""

    @classmethod
    def from_dict(cls, d: ShownThroughDict) -> ShownThrough:
        return cls(d["setting"], d["bound"], d["level"], d["text"])

    def to_dict(self) -> ShownThroughDict:
        return {"setting": self.setting, "bound": self.bound, "level": self.level, "text": self.text}


class SimulationErrorDict(TypedDict):
    validated_at: list[int]
    errors: dict[str, float]
    text: str


@dataclass(frozen=True)
class SimulationError:
    """How well the simulator behind a simulated verdict matched the measured loads
    (specledger.gates.simulated.error_note)."""

    validated_at: tuple[int, ...]
    """The measured loads > 1 it was checked at (empty: not validated)."""
    errors: dict[str, float]
    """Figure -> largest |relative error| there (0.05 = 5 %)."""
    text: str
    """The same in words, or "not validated"."""

    @classmethod
    def from_dict(cls, d: SimulationErrorDict) -> SimulationError:
        return cls(tuple(d.get("validated_at") or ()), dict(d.get("errors") or {}), d["text"])

    def to_dict(self) -> SimulationErrorDict:
        return {"validated_at": list(self.validated_at), "errors": dict(self.errors), "text": self.text}


class RaceDropDict(TypedDict):
    setting: str
    after_prompts: int | None
    why: str | None


@dataclass(frozen=True)
class RaceDrop:
    """A setting the main job's race dropped from this decision (``run.json`` ``race.dropped``)."""

    setting: str
    """Its setting name."""
    after_prompts: int | None
    """Prompts measured when it was dropped."""
    why: str | None
    """The race's reason."""

    @classmethod
    def from_dict(cls, d: RaceDropDict) -> RaceDrop:
        return cls(d["setting"], d.get("after_prompts"), d.get("why"))

    def to_dict(self) -> RaceDropDict:
        return {"setting": self.setting, "after_prompts": self.after_prompts, "why": self.why}


class LegacyDropDict(TypedDict, total=False):
    label: str
    after_prompts: int | None
    why: str | None


@dataclass(frozen=True)
class LegacyDrop:
    """A setting the race stopped running, as a verdict's ``dropped`` listed it in summaries written before
    ``race_dropped`` (the rule never writes one; the report still shows them)."""

    label: str = ""
    """The setting ("ngram γ=2")."""
    after_prompts: int | None = None
    """The category's prompts when it was dropped."""
    why: str | None = None
    """Why: the paired comparison that put it out, or the plain reason."""

    @classmethod
    def from_dict(cls, d: LegacyDropDict) -> LegacyDrop:
        return cls(d.get("label", ""), d.get("after_prompts"), d.get("why"))

    def to_dict(self) -> LegacyDropDict:
        return {"label": self.label, "after_prompts": self.after_prompts, "why": self.why}


class MixSettingDict(TypedDict):
    setting: str
    speedup: float | None
    speedup_ci: list[float | None]
    prompts: int
    per_category: dict[str, float | None]


@dataclass(frozen=True)
class MixSetting:
    """One setting's figures on the traffic mix (specledger.gates.mix)."""

    setting: str
    """Its setting name."""
    speedup: float | None
    """S on the mix against plain; unknown: NaN as the rule computes it, null in the file (None read back)."""
    speedup_ci: Interval
    """Its stratified 1 − α interval; an unbounded end is infinite as the rule computes it, null in the file (None
    read back)."""
    prompts: int
    """Paired prompts behind it."""
    per_category: dict[str, float | None]
    """Its S in each category (null: not measured there)."""

    @classmethod
    def from_dict(cls, d: MixSettingDict) -> MixSetting:
        lo, hi = d["speedup_ci"]
        return cls(d["setting"], d["speedup"], (lo, hi), d["prompts"], dict(d["per_category"]))

    def to_dict(self) -> MixSettingDict:
        return {"setting": self.setting, "speedup": self.speedup, "speedup_ci": list(self.speedup_ci),
                "prompts": self.prompts, "per_category": dict(self.per_category)}


class _VerdictKeys(TypedDict):
    """The keys every verdict carries (see :class:`Verdict` for their meaning)."""

    category: str
    temperature: float
    resolved: bool | None
    tied_with: list[str]
    equivalent_to: list[str]
    comparisons: list[ComparisonDict]
    prompts_needed: int | None
    contenders: list[str]
    slo_out_of_reach: str | None
    decision: Decision
    drafter: str | None
    gamma: int | str | None
    label: str
    speedup: float | None
    speedup_ci: list[float | None]
    setting: str | None
    mean_committed: float | None
    prompts: int
    resolution: Resolution | None
    headline: str
    reason: str


class VerdictDict(_VerdictKeys, total=False):
    """A verdict as JSON (``summary.json`` ``verdicts`` / ``mix``): :meth:`Verdict.to_dict`."""

    context_bucket: Bucket
    repeated_ngram_fraction: float | None
    shown_through: ShownThroughDict
    needs_plain: bool
    weights: dict[str, float]
    settings: list[MixSettingDict]
    load: int
    simulated: bool
    simulation_error: SimulationErrorDict
    race_dropped: list[RaceDropDict]
    dropped: list[LegacyDropDict]


@dataclass
class Verdict:
    """The decision for one (category, temperature) at one load, as specledger.gates.verdicts decides it. Fields
    default to None where the key is absent from the dict form (a key only some verdicts carry)."""

    category: str
    """Workload category: the decision key ("CATEGORY@BUCKET" where decided per context bucket, "all traffic"
    for the mix)."""
    temperature: float
    """Sampling temperature (0 = greedy)."""
    decision: Decision = NO_DECISION
    """"deploy": run ``drafter`` at ``gamma``; "off": plain decoding; "control": a control category (random
    tokens), never deployed; "no-decision": too few speculative rounds were measured to decide anything (``reason``
    says what to change)."""
    resolution: Resolution | None = NO_DATA
    """Why the decision is, or is not, settled: "winner" (one setting beats every other, paired), "equivalent"
    (leader and others within the equivalence margin; the rule picked the cheapest), "off" (decisively off),
    "open" (not resolved), "no-data", "control". Absent from summaries written before the key: read as None, the
    status then told by ``resolved``."""
    resolved: bool | None = False
    """True for a winner, an equivalence or a decisive off (a rerun decides alike); false while open or without
    data. Absent from summaries written before the key: read as None."""
    label: str = ""
    """The chosen scenario's label, or the decision itself when nothing is deployed."""
    drafter: str | None = None
    """The drafter to deploy; null unless decision is "deploy"."""
    gamma: int | str | None = None
    """γ: candidates proposed per round (an integer), or the name of an adaptive policy; null where nothing is
    deployed."""
    setting: str | None = None
    """"drafter γ=g" of the chosen setting, else of the leader or the fastest."""
    speedup: float | None = None
    """S of that setting over plain decoding (null: nothing measured)."""
    speedup_ci: Interval = (None, None)
    """The 1 − α interval of that S the decision used (null where unbounded)."""
    prompts: int = 0
    """Paired prompts behind the verdict's S (its speedup_ci); each comparison carries its own n."""
    mean_committed: float | None = None
    """E[L] of that setting: tokens committed per full round."""
    tied_with: list[str] = field(default_factory=list)
    """Labels of settings the chosen one could not be separated from (open) or is equivalent to."""
    equivalent_to: list[str] = field(default_factory=list)
    """Settings equivalent to the chosen one within the margin (TOST)."""
    comparisons: list[Comparison] = field(default_factory=list)
    """The paired comparisons of the leader with every other eligible setting."""
    prompts_needed: int | None = None
    """Paired prompts that would likely settle an open decision (null: unknown, or resolved)."""
    contenders: list[str] = field(default_factory=list)
    """Open decisions: the leader and every setting whose paired comparison with it is open (what a race keeps
    running)."""
    slo_out_of_reach: str | None = None
    """Set when plain decoding itself misses the SLO at this load (a capacity fact, not a verdict on
    speculation)."""
    headline: str = ""
    """The one reason, as one short sentence."""
    reason: str = ""
    """The full reason: the figures and the rule that decided."""
    context_bucket: Bucket | None = None
    """The context bucket this decision covers (prompt tokens), present where the category was decided per bucket;
    its category is then 'CATEGORY@BUCKET'."""
    repeated_ngram_fraction: float | None = None
    """Controls only: share of plain outputs' 4-grams seen earlier in the same output (null: too short)."""
    shown_through: ShownThrough | None = None
    """A deploy whose own S interval does not clear slo.min_ci_low but is shown faster than plain through another
    setting that does: setting, bound, level, text."""
    needs_plain: bool | None = None
    """Open decisions: whether more prompts must run plain decoding too (S against plain still open), or only the
    contenders (what is open is between settings)."""
    weights: dict[str, float] | None = None
    """The mix only: each category's share of the traffic (of its requests, or --mix)."""
    settings: list[MixSetting] | None = None
    """The mix only: each setting's S on the mix and in every category."""
    load: int | None = None
    """Concurrent requests it was measured, simulated or decided at (absent: 1, one request at a time; the rule
    leaves it to its caller)."""
    simulated: bool | None = None
    """True when the decision rests on the simulator (loads not measured); the rule leaves it to its caller."""
    simulation_error: SimulationError | None = None
    """Simulated loads: how well the simulator matched the measured loads (validated_at, errors per figure,
    text)."""
    race_dropped: list[RaceDrop] | None = None
    """The settings the race dropped from this decision (specledger run's race), with why (absent: none)."""
    dropped: list[LegacyDrop] | None = None
    """Settings the race stopped running, in summaries written before ``race_dropped`` (label, after_prompts, why);
    the rule never writes it."""

    @property
    def key(self) -> tuple[str, float]:
        """(category, temperature): the decision it belongs to."""
        return self.category, float(self.temperature)

    @property
    def deploys(self) -> bool:
        """A setting is deployed (resolved or provisionally, while open)."""
        return self.decision == DEPLOY

    @property
    def is_control(self) -> bool:
        return self.decision == CONTROL

    @property
    def is_off(self) -> bool:
        return self.decision == OFF

    @property
    def is_open(self) -> bool:
        """Not yet resolved: the race would run its contenders."""
        return self.resolution == OPEN

    @property
    def load_or_solo(self) -> int:
        """The load it was decided at, 1 (one request at a time) where unlabelled."""
        return int(self.load or 1)

    @classmethod
    def from_dict(cls, d: VerdictDict) -> Verdict:
        """A verdict from its dict form; a key left out reads as the field's default."""
        shown, sim = d.get("shown_through"), d.get("simulation_error")
        drops, mix, legacy = d.get("race_dropped"), d.get("settings"), d.get("dropped")
        return cls(
            category=d.get("category", ""), temperature=d.get("temperature", 0.0),
            decision=d.get("decision", NO_DECISION), resolution=d.get("resolution", NO_DATA),
            resolved=d.get("resolved", False), label=d.get("label", ""), drafter=d.get("drafter"),
            gamma=d.get("gamma"), setting=d.get("setting"), speedup=d.get("speedup"),
            speedup_ci=_pair(d.get("speedup_ci")), prompts=d.get("prompts", 0),
            mean_committed=d.get("mean_committed"), tied_with=list(d.get("tied_with") or []),
            equivalent_to=list(d.get("equivalent_to") or []),
            comparisons=[Comparison.from_dict(c) for c in d.get("comparisons") or []],
            prompts_needed=d.get("prompts_needed"), contenders=list(d.get("contenders") or []),
            slo_out_of_reach=d.get("slo_out_of_reach"), headline=d.get("headline", ""), reason=d.get("reason", ""),
            context_bucket=d.get("context_bucket"), repeated_ngram_fraction=d.get("repeated_ngram_fraction"),
            shown_through=ShownThrough.from_dict(shown) if shown is not None else None,
            needs_plain=d.get("needs_plain"), weights=d.get("weights"),
            settings=[MixSetting.from_dict(s) for s in mix] if mix is not None else None,
            load=d.get("load"), simulated=d.get("simulated"),
            simulation_error=SimulationError.from_dict(sim) if sim is not None else None,
            race_dropped=[RaceDrop.from_dict(r) for r in drops] if drops is not None else None,
            dropped=[LegacyDrop.from_dict(x) for x in legacy] if legacy is not None else None)

    def to_dict(self) -> VerdictDict:
        """The JSON-ready dict, its keys in the order the rule has always written them (a control's
        ``resolution`` right after its ``decision``)."""
        out: VerdictDict = {  # type: ignore[typeddict-item]  # the other keys follow, in their order
            "category": self.category, "temperature": self.temperature, "resolved": self.resolved,
            "tied_with": list(self.tied_with), "equivalent_to": list(self.equivalent_to),
            "comparisons": [c.to_dict() for c in self.comparisons], "prompts_needed": self.prompts_needed,
            "contenders": list(self.contenders), "slo_out_of_reach": self.slo_out_of_reach}
        if self.context_bucket is not None:
            out["context_bucket"] = self.context_bucket
        out["decision"] = self.decision
        if self.is_control:
            out["resolution"] = self.resolution
        out.update(drafter=self.drafter, gamma=self.gamma, label=self.label, speedup=self.speedup,
                   speedup_ci=list(self.speedup_ci), setting=self.setting, mean_committed=self.mean_committed,
                   prompts=self.prompts)
        if self.is_control:
            out["repeated_ngram_fraction"] = self.repeated_ngram_fraction
        else:
            out["resolution"] = self.resolution
        out["headline"] = self.headline
        if self.shown_through is not None:
            out["shown_through"] = self.shown_through.to_dict()
        if self.needs_plain is not None:
            out["needs_plain"] = self.needs_plain
        out["reason"] = self.reason
        if self.weights is not None:
            out["weights"] = dict(self.weights)
        if self.settings is not None:
            out["settings"] = [s.to_dict() for s in self.settings]
        if self.load is not None:
            out["load"] = self.load
        if self.simulated is not None:
            out["simulated"] = self.simulated
        if self.simulation_error is not None:
            out["simulation_error"] = self.simulation_error.to_dict()
        if self.race_dropped is not None:
            out["race_dropped"] = [r.to_dict() for r in self.race_dropped]
        if self.dropped is not None:
            out["dropped"] = [x.to_dict() for x in self.dropped]
        return out


@dataclass(frozen=True)
class DecisionGroup:
    """What one verdict decides: a (category, temperature) at one load, and what every entry for it carries."""

    category: str  # the decision key (a category, "<category>@<bucket>", or the mix's "all traffic")
    temperature: float
    slo_out_of_reach: str | None = None  # plain decoding misses the SLO at this load (why), else None
    context_bucket: str | None = None  # the context bucket a split category decides here, else None

    def verdict(self, decision: str, resolution: str, resolved: bool) -> Verdict:
        """A verdict of this group with nothing measured yet."""
        return Verdict(category=self.category, temperature=self.temperature, decision=decision,
                       resolution=resolution, resolved=resolved, slo_out_of_reach=self.slo_out_of_reach,
                       context_bucket=self.context_bucket)


def as_verdict(v: Verdict | VerdictDict) -> Verdict:
    """``v`` as a :class:`Verdict`: itself, or read from its dict form."""
    return v if isinstance(v, Verdict) else Verdict.from_dict(v)


__all__ = ["BY_EQUIVALENCE", "CONTROL", "DEPLOY", "NO_DATA", "NO_DECISION", "OFF", "OPEN", "WINNER", "Comparison",
           "ComparisonDict", "Decision", "DecisionGroup", "Interval", "LegacyDrop", "LegacyDropDict", "MixSetting",
           "MixSettingDict", "PairedVerdict", "RaceDrop", "RaceDropDict", "Resolution", "ShownThrough",
           "ShownThroughDict", "SimulationError", "SimulationErrorDict", "Verdict", "VerdictDict", "as_verdict",
           "interval_of"]
