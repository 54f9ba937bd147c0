"""``summary.json``'s decisions as types: the verdicts (and the mix's), :class:`VerdictEntry`, the file's mirror of
:class:`specledger.gates.decision.Verdict` (the same fields, plus the ``dropped`` of summaries before
``race_dropped``; :meth:`VerdictEntry.as_verdict` gives the gates' own type), and the schedules over loads and
context buckets. Part of :class:`specledger.report.summary_model.Summary`; every type is a
:class:`~specledger.report.summary_rows.FileModel` (lenient to read, strict as a schema)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from specledger.gates.decision import NO_DATA, Comparison, Verdict
from specledger.report.summary_rows import (
    Count,
    FileModel,
    Gamma,
    Interval,
    Keyed,
    KeyedAtLoad,
    Load,
)

Decision = Literal["deploy", "off", "control", "no-decision"]
Resolution = Literal["winner", "equivalent", "off", "open", "no-data", "control"]
Bucket = Literal["<1k", "1-2k", "2-4k", "4-8k", ">=8k"]


class ComparisonEntry(FileModel):
    """One paired comparison of two settings: the ratio of their speed-ups on the same prompts."""

    REQUIRED = ("a", "b", "ratio", "ci", "verdict")
    NEVER_NULL = ("n",)
    a: str = ""
    """Setting a (the leader)."""
    b: str = ""
    """Setting b."""
    ratio: float | None = None
    """S_a / S_b, paired."""
    ci: Interval = (None, None)
    """Interval of the ratio."""
    n: int | None = None
    """Paired prompts."""
    verdict: Literal["a faster", "b faster", "equivalent", "open"] = "open"
    """"equivalent": the interval lies inside [1/(1+m), 1+m] (TOST, m = slo.equivalence_margin); "a faster" /
    "b faster": it excludes 1; else "open"."""


class DroppedSetting(FileModel):
    """A setting the race stopped running: ``race.dropped`` (and a verdict's ``dropped`` in older summaries)."""

    category: str | None = None
    """The decision's category (``race.dropped``)."""
    temperature: float | None = None
    """Its temperature (``race.dropped``)."""
    label: str = ""
    """The setting ("ngram γ=2")."""
    after_prompts: int | None = None
    """The category's prompts when it was dropped."""
    after_s: float | None = None
    """Seconds into the race (``race.dropped``)."""
    why: str | None = None
    """Why: the paired comparison that put it out, or the plain reason."""


class RaceDropEntry(FileModel):
    """A setting the race dropped from this decision (its ``race_dropped``)."""

    setting: str = ""
    """Its name."""
    after_prompts: int | None = None
    """Prompts measured when it was dropped."""
    why: str | None = None
    """The race's reason."""


class ShownThroughEntry(FileModel):
    """A deploy shown faster than plain only through another setting that clears slo.min_ci_low."""

    setting: str = ""
    """That setting."""
    bound: float = 0.0
    """lo(S_setting) · lo(paired ratio): the chained lower bound on S."""
    level: float = 0.0
    """The chained bound's confidence level, 1 − 2·decision_alpha at worst."""
    text: str = ""
    """The words the answer shows."""


class SimulationErrorEntry(FileModel):
    """How well the simulator matched the measured loads."""

    validated_at: list[int] = []
    """The measured loads > 1 it was checked at (empty: not validated)."""
    errors: dict[str, float] = {}
    """Figure -> largest |relative error| there (0.05 = 5 %)."""
    text: str = ""
    """The same in words."""


class MixSettingEntry(FileModel):
    """One setting's figures on the traffic mix."""

    setting: str = ""
    """Its name."""
    speedup: float | None = None
    """S on the mix against plain."""
    speedup_ci: Interval = (None, None)
    """Its stratified interval."""
    prompts: int | None = None
    """Paired prompts behind it."""
    per_category: dict[str, float | None] = {}
    """Its S in each category (null: not measured there)."""


class VerdictEntry(KeyedAtLoad):
    """The decision for one (category, temperature) at one load."""

    REQUIRED = ("category", "temperature", "load", "simulated", "decision", "label", "speedup", "speedup_ci",
                "reason", "headline", "resolved", "resolution")
    NEVER_NULL = ("load", "simulated", "resolution", "resolved", "prompts", "context_bucket", "shown_through",
                  "needs_plain", "race_dropped", "weights", "settings")
    simulated: bool | None = None
    """True when the decision rests on the simulator (loads not measured)."""
    decision: Decision = "off"
    """"deploy": run ``drafter`` at ``gamma``; "off": plain decoding; "control": a control category (random
    tokens), never deployed; "no-decision": too few speculative rounds were measured to decide anything (``reason``
    says what to change)."""
    resolution: Resolution | None = None
    """Why the decision is, or is not, settled: "winner" (one setting beats every other, paired), "equivalent"
    (leader and others within the equivalence margin; the rule picked the cheapest), "off" (decisively off),
    "open" (not resolved), "no-data", "control"."""
    resolved: bool | None = None
    """True for a winner, an equivalence or a decisive off; false while open."""
    drafter: str | None = None
    """The drafter to deploy; null unless decision is "deploy"."""
    gamma: Gamma | None = None
    """γ: candidates proposed per round (an integer), or the name of an adaptive policy; null where nothing is
    deployed."""
    label: str = ""
    """The chosen scenario's label, or the decision itself when nothing is deployed."""
    setting: str | None = None
    """"drafter γ=g" of the chosen (or fastest) setting."""
    speedup: float | None = None
    """S of the chosen (or fastest) setting over plain decoding."""
    speedup_ci: Interval = (None, None)
    """The interval of that S the decision used."""
    mean_committed: float | None = None
    """E[L] of that setting: tokens committed per full round."""
    prompts: Count | None = None
    """Paired prompts behind the verdict's S (its speedup_ci); each comparison carries its own n."""
    headline: str = ""
    """The one reason, as one short sentence."""
    reason: str = ""
    """The full reason: the figures and the rule that decided."""
    tied_with: list[str] = []
    """Labels of settings the chosen one could not be separated from (open) or is equivalent to."""
    equivalent_to: list[str] = []
    """Settings equivalent to the chosen one within the margin."""
    comparisons: list[ComparisonEntry] = []
    """The paired comparisons of the leader with every other contender."""
    dropped: list[DroppedSetting] = []
    """Settings the race stopped running (summaries before ``race_dropped``): label, after_prompts, why."""
    contenders: list[str] = []
    """Open decisions: the leader and every setting whose paired comparison with it is open (what a race keeps
    running)."""
    needs_plain: bool | None = None
    """Open decisions: whether more prompts must run plain decoding too (S against plain still open), or only the
    contenders (what is open is between settings)."""
    simulation_error: SimulationErrorEntry | None = None
    """Simulated loads: how well the simulator matched the measured loads (validated_at, errors per figure,
    text)."""
    prompts_needed: int | None = None
    """Paired prompts that would likely settle an open decision."""
    slo_out_of_reach: str | None = None
    """Set when plain decoding itself misses the SLO at this load (a capacity fact, not a verdict on
    speculation)."""
    repeated_ngram_fraction: float | None = None
    """Controls only: share of plain outputs' 4-grams seen earlier in the same output."""
    context_bucket: Bucket | None = None
    """The context bucket this decision covers (prompt tokens), present where the category was decided per bucket;
    its category is then 'CATEGORY@BUCKET'."""
    shown_through: ShownThroughEntry | None = None
    """A deploy whose own S interval does not clear slo.min_ci_low but is shown faster than plain through another
    setting that does: setting, bound, level, text."""
    race_dropped: list[RaceDropEntry] | None = None
    """The settings the race dropped from this decision (specledger run's race), with why."""
    weights: dict[str, float] | None = None
    """The mix only: each category's share of the traffic (of its requests, or --mix)."""
    settings: list[MixSettingEntry] | None = None
    """The mix only: each setting's S on the mix and in every category."""

    def as_verdict(self) -> Verdict:
        """The gates' own :class:`~specledger.gates.decision.Verdict` of it (the mix's figures and the race's story
        left out): what :mod:`specledger.gates.schedule` reads."""
        return Verdict(
            self.category, self.temperature, decision=self.decision, resolution=self.resolution or NO_DATA,
            resolved=bool(self.resolved), label=self.label, drafter=self.drafter, gamma=self.gamma,
            setting=self.setting, speedup=self.speedup, speedup_ci=self.speedup_ci, prompts=self.prompts or 0,
            mean_committed=self.mean_committed, tied_with=list(self.tied_with), equivalent_to=list(self.equivalent_to),
            comparisons=[Comparison(c.a, c.b, c.ratio if c.ratio is not None else float("nan"), c.ci, c.n or 0,
                                    c.verdict) for c in self.comparisons],
            prompts_needed=self.prompts_needed, contenders=list(self.contenders),
            slo_out_of_reach=self.slo_out_of_reach, headline=self.headline, reason=self.reason,
            context_bucket=self.context_bucket, needs_plain=self.needs_plain, load=self.load,
            simulated=self.simulated)


class MixVerdictEntry(VerdictEntry):
    """One setting for the traffic as a whole at one temperature (specledger.gates.mix): a verdict (category 'all
    traffic', decided at the solo load) with the traffic's ``weights`` and every setting's figures."""

    REQUIRED = tuple(k for k in VerdictEntry.REQUIRED if k not in ("load", "simulated")) + ("weights", "settings")


class ScheduleDecisionEntry(FileModel):
    """One load's decision in a schedule: the answer as keys, no text to parse."""

    REQUIRED = ("load", "decision", "setting", "drafter", "gamma", "simulated", "engine_gamma")
    load: Load = 1
    """Concurrent requests."""
    decision: str | None = None
    """The verdict's decision there: deploy, off, no-decision or control."""
    setting: str = "off"
    """"ngram γ=4" where deployed, else "off"."""
    drafter: str | None = None
    """The drafter deployed there; null when not deploy."""
    gamma: Gamma | None = None
    """Its γ (an integer, or a γ policy's name); null when not deploy."""
    simulated: bool = False
    """Decided by the simulator."""
    engine_gamma: Count = 0
    """The k the engine configs run at this load (0: off, or another drafter decided it)."""


class LaunchedEngine(FileModel):
    """probe --launch: the launched engine's own command for the schedule (its other engines' configs dropped)."""

    kind: str = ""
    """The engine (llama.cpp, vllm, sglang)."""
    command: str | None = None
    """The command line to deploy it; null where speculation pays at no measured load."""


#: an engine's paste-ready config: its JSON document, or its launch flags (argv words)
EngineConfig = dict[str, JsonValue] | list[str] | None


class ScheduleEntry(Keyed):
    """One (category, temperature)'s decisions over loads, and the engine configs that deploy them."""

    REQUIRED = ("category", "temperature", "text")
    NEVER_NULL = ("control", "gamma", "note", "configs_note", "engine")
    control: bool | None = None
    """A control category: never deployed."""
    text: str = ""
    """The schedule as one line, e.g. "ngram γ=4 at 1, off from 16" ("(sim)": decided by the simulator)."""
    at_target: VerdictEntry | None = None
    """The verdict at slo.target_load, when one is set."""
    drafter: str | None = None
    """The deployment's one drafter (the target load's, else the lowest deploying load's); null when speculation is
    off at every load."""
    gamma: Annotated[int, Field(ge=0)] | None = None
    """The draft length a one-γ server runs (SGLang, llama.cpp): the first on-range's; 0 when off."""
    decisions: list[ScheduleDecisionEntry] = []
    """The decision at every decided load, load-sorted."""
    versions: dict[str, str] | None = None
    """The engine version (and source) each config's schema follows, by key (vllm, trtllm, sglang, llama_cpp); null
    for a control."""
    vllm: dict[str, JsonValue] | None = None
    """The JSON value `vllm serve --speculative-config` takes (method, num_speculative_tokens,
    num_speculative_tokens_per_batch_size as [[start, end, k], …]; not wrapped); null where vLLM cannot run it.
    Schema: `versions.vllm`."""
    trtllm: dict[str, JsonValue] | None = None
    """TensorRT-LLM `{"speculative_config": {…}}` as its --extra_llm_api_options file holds it (decoding_type,
    max_draft_len, draft_len_schedule); null where it cannot run it."""
    sglang: EngineConfig = None
    """SGLang launch flags (argv words); null where it cannot run it."""
    llama_cpp: EngineConfig = None
    """llama-server flags (argv words) of the llama.cpp in `versions.llama_cpp`; null where it cannot run it, or
    where the llama-server $SPECLEDGER_LLAMA_SERVER names lacks one of them."""
    ranges: list[list[JsonValue]] | None = None
    """[[start, end, γ], …]: the γ per load range, covering 1..the largest load."""
    note: str | None = None
    """Another drafter decided some loads, and which."""
    configs_note: str | None = None
    """The engines' notes: what is missing, what to replace."""
    engine: LaunchedEngine | None = None
    """probe --launch: the launched engine's command, in place of the other engines' configs."""

    def config(self, kind: str) -> EngineConfig:
        """The config of engine ``kind`` (vllm, trtllm, sglang, llama_cpp); None where there is none."""
        return {"vllm": self.vllm, "trtllm": self.trtllm, "sglang": self.sglang, "llama_cpp": self.llama_cpp}[kind]


class BucketEntry(FileModel):
    """One context bucket's decision in a context schedule."""

    REQUIRED = ("bucket", "decision", "resolved")
    NEVER_NULL = ("bucket",)
    bucket: str | None = None
    """The bucket ("1-2k")."""
    decision: str | None = None
    """The verdict's decision there."""
    setting: str | None = None
    """The setting it reports."""
    speedup: float | None = None
    """Its S against plain."""
    mean_committed: float | None = None
    """E[L]."""
    resolved: bool = False
    """The decision stands."""


class ContextScheduleEntry(FileModel):
    """A category decided in two or more context buckets: its buckets in length order and where speculation stops
    (or starts) paying, counting resolved decisions only (specledger.gates.context_schedule)."""

    REQUIRED = ("category", "temperature", "load", "buckets", "stops_at_tokens", "starts_at_tokens", "engine_note")
    category: str = ""
    """Workload category."""
    temperature: float = 0.0
    """Sampling temperature."""
    load: int = 1
    """The load the buckets were decided at."""
    buckets: list[BucketEntry] = []
    """Its buckets in length order."""
    stops_at_tokens: int | None = None
    """The first bucket edge where a resolved deploy turns resolved off."""
    starts_at_tokens: int | None = None
    """The first bucket edge where resolved off turns a resolved deploy."""
    engine_note: str | None = None
    """How to deploy the turn (route by length)."""


__all__ = ["Bucket", "BucketEntry", "ComparisonEntry", "ContextScheduleEntry", "Decision", "DroppedSetting",
           "EngineConfig", "LaunchedEngine", "MixSettingEntry", "MixVerdictEntry", "RaceDropEntry", "Resolution",
           "ScheduleDecisionEntry", "ScheduleEntry", "ShownThroughEntry", "SimulationErrorEntry", "VerdictEntry"]
