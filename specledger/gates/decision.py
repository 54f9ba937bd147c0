"""The verdict as a type: one decision per (category, temperature) at one load, what
:func:`specledger.gates.verdicts.verdicts` decides and ``summary.json`` carries under ``verdicts`` (and ``mix``).

:class:`Verdict` holds every key a verdict carries; :meth:`Verdict.to_dict` gives the JSON-ready dict
(:class:`VerdictDict`) with exactly the keys it had before this type existed -- a key that only some verdicts
carry (``needs_plain``, ``shown_through``, ``context_bucket``, ``load`` ...) stays absent where it is None -- in
the same order, and :meth:`Verdict.from_dict` reads one back (``from_dict(d).to_dict() == d`` for every verdict
the rule writes). A hand-built dict may leave keys out: each reads as its field's default.

Decisions: :data:`DEPLOY`, :data:`OFF`, :data:`CONTROL`, :data:`NO_DECISION`. Resolutions: :data:`WINNER`,
:data:`BY_EQUIVALENCE`, :data:`OFF`, :data:`OPEN`, :data:`NO_DATA`, :data:`CONTROL`. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

#: the decision: deploy a setting / speculation off / a control, never deployed / nothing measurable
DEPLOY, OFF, CONTROL, NO_DECISION = "deploy", "off", "control", "no-decision"
Decision = Literal["deploy", "off", "control", "no-decision"]
#: how it was reached: the chosen setting beats every other (or is the only one that passes the gates) /
#: chosen by the rule among settings within the margin / ``OFF`` / still ``OPEN`` / ``NO_DATA`` / ``CONTROL``
WINNER, BY_EQUIVALENCE, OPEN, NO_DATA = "winner", "equivalent", "open", "no-data"
Resolution = Literal["winner", "equivalent", "off", "open", "no-data", "control"]

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
    ratio: float
    ci: list[float | None]
    n: int
    verdict: str


@dataclass(frozen=True)
class Comparison:
    """The leader against one other eligible setting, paired: S_a / S_b on the prompts both ran."""

    a: str  # the leader's setting name ("suffix γ=4")
    b: str  # the other setting's name
    ratio: float  # S_a / S_b (NaN when unknown)
    ci: Interval  # its 1 − α confidence-sequence interval; None where unbounded
    n: int  # paired prompts behind it
    verdict: str  # analysis.paired: "a faster" | "b faster" | "equivalent" | "open"

    @classmethod
    def from_dict(cls, d: ComparisonDict) -> Comparison:
        return cls(d["a"], d["b"], d["ratio"], _pair(d.get("ci")), d["n"], d["verdict"])

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
    that pays: lo(S_via) · lo(S_chosen / S_via)."""

    setting: str  # the setting it is shown through
    bound: float  # the chained lower bound on S
    level: float  # its confidence level (0.9 = 90 %): 1 − 2α at worst
    text: str  # the same in words, for the answer line

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
    """How well the simulator behind a simulated verdict was validated
    (:func:`specledger.gates.simulated.error_note`)."""

    validated_at: tuple[int, ...]  # the measured loads > 1 it was checked at (empty: not validated)
    errors: dict[str, float]  # figure -> largest |relative error| there (0.05 = 5 %)
    text: str  # in words, or "not validated"

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

    setting: str  # its setting name
    after_prompts: int | None  # prompts measured when it was dropped
    why: str | None  # the race's reason

    @classmethod
    def from_dict(cls, d: RaceDropDict) -> RaceDrop:
        return cls(d["setting"], d.get("after_prompts"), d.get("why"))

    def to_dict(self) -> RaceDropDict:
        return {"setting": self.setting, "after_prompts": self.after_prompts, "why": self.why}


class MixSettingDict(TypedDict):
    setting: str
    speedup: float
    speedup_ci: list[float]
    prompts: int
    per_category: dict[str, float | None]


@dataclass(frozen=True)
class MixSetting:
    """One setting's figures on the traffic mix (:mod:`specledger.gates.mix`)."""

    setting: str  # its setting name
    speedup: float  # S_mix against plain
    speedup_ci: tuple[float, float]  # its stratified 1 − α interval (may be infinite)
    prompts: int  # paired prompts behind it
    per_category: dict[str, float | None]  # its S in each category (None: not measured there)

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
    resolved: bool
    tied_with: list[str]
    equivalent_to: list[str]
    comparisons: list[ComparisonDict]
    prompts_needed: int | None
    contenders: list[str]
    slo_out_of_reach: str | None
    decision: str
    drafter: str | None
    gamma: int | str | None
    label: str
    speedup: float | None
    speedup_ci: list[float | None]
    setting: str | None
    mean_committed: float | None
    prompts: int
    resolution: str
    headline: str
    reason: str


class VerdictDict(_VerdictKeys, total=False):
    """A verdict as JSON (``summary.json`` ``verdicts`` / ``mix``): :meth:`Verdict.to_dict`."""

    context_bucket: str
    repeated_ngram_fraction: float | None
    shown_through: ShownThroughDict
    needs_plain: bool
    weights: dict[str, float]
    settings: list[MixSettingDict]
    load: int
    simulated: bool
    simulation_error: SimulationErrorDict
    race_dropped: list[RaceDropDict]


@dataclass
class Verdict:
    """The decision of one (category, temperature) at one load (:mod:`specledger.gates.verdicts`). Fields default
    to None where the key is absent from the dict form (a key only some verdicts carry)."""

    category: str  # the decision key: a workload category, "<category>@<bucket>", or "all traffic" (the mix)
    temperature: float  # sampling temperature
    decision: str = NO_DECISION  # DEPLOY | OFF | CONTROL | NO_DECISION
    resolution: str = NO_DATA  # WINNER | BY_EQUIVALENCE | OFF | OPEN | NO_DATA | CONTROL
    resolved: bool = False  # True: the decision stands (a rerun decides alike); False: open or no data
    label: str = ""  # the chosen scenario's label where it deploys, else the decision ("off", "control")
    drafter: str | None = None  # the deployed drafter (None unless it deploys)
    gamma: int | str | None = None  # the deployed draft length, or its policy's name (None unless it deploys)
    setting: str | None = None  # the setting reported ("ngram γ=4"): the pick, the leader, or the fastest
    speedup: float | None = None  # that setting's S against plain (None: nothing measured)
    speedup_ci: Interval = (None, None)  # its 1 − α interval; None where unbounded
    prompts: int = 0  # paired prompts behind ``speedup``
    mean_committed: float | None = None  # E[L]: mean tokens committed per full round of that setting
    tied_with: list[str] = field(default_factory=list)  # scenario labels it could not be told apart from
    equivalent_to: list[str] = field(default_factory=list)  # settings within the margin of the pick (TOST)
    comparisons: list[Comparison] = field(default_factory=list)  # the leader against every other eligible setting
    prompts_needed: int | None = None  # paired prompts that would settle an open decision (None: unknown / resolved)
    contenders: list[str] = field(default_factory=list)  # settings still racing (open decisions only)
    slo_out_of_reach: str | None = None  # why the SLO fails at this load even without speculation, else None
    headline: str = ""  # the cause in one line
    reason: str = ""  # the decision and its cause in sentences
    context_bucket: str | None = None  # the context bucket decided ("1-2k"); None: not split by context
    repeated_ngram_fraction: float | None = None  # controls only: plain's repeated 4-gram share (None: too short)
    shown_through: ShownThrough | None = None  # a deploy shown faster than plain only through another setting
    needs_plain: bool | None = None  # open decisions only: settling it needs more plain runs too
    weights: dict[str, float] | None = None  # the mix only: each category's share of the traffic
    settings: list[MixSetting] | None = None  # the mix only: every setting's S on the mix
    load: int | None = None  # concurrency it was decided at (None until labelled by the caller)
    simulated: bool | None = None  # decided by the simulator (None until labelled by the caller)
    simulation_error: SimulationError | None = None  # simulated verdicts only: the simulator's validation
    race_dropped: list[RaceDrop] | None = None  # settings the race dropped here (None: none dropped)

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
        drops, mix = d.get("race_dropped"), d.get("settings")
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
            race_dropped=[RaceDrop.from_dict(r) for r in drops] if drops is not None else None)

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
           "ComparisonDict", "Decision", "DecisionGroup", "Interval", "MixSetting", "MixSettingDict", "RaceDrop",
           "RaceDropDict", "Resolution", "ShownThrough", "ShownThroughDict", "SimulationError", "SimulationErrorDict",
           "Verdict", "VerdictDict", "as_verdict", "interval_of"]
