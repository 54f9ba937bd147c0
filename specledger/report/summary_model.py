"""``summary.json`` as one type (:class:`Summary`): what the report reads (:meth:`Summary.read`, once per summary),
and the source of the file's JSON Schema (``specledger/schemas/summary.schema.json`` is :func:`summary_schema`,
written by ``scripts/gen_summary_schema.py``; a test keeps the file equal to it).

The decisions are :mod:`specledger.report.summary_verdicts`' (a verdict is the gates' own
:class:`~specledger.gates.decision.Verdict`), the figure rows :mod:`specledger.report.summary_rows`'. Every other type
is a :class:`~specledger.report.summary_rows.FileModel`: lenient to read (a summary written before a key existed
still reads, as the report always read it), strict as a schema. Genuinely open parts (side
experiments, cost models, the run plan, the simulation's validation) stay JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema

from specledger.errors import SpecLedgerError
from specledger.report.summary_rows import (
    Count,
    FileModel,
    Load,
    OptimalGamma,
    PredictionCheck,
    SettingRow,
)
from specledger.report.summary_verdicts import (
    FILE_KEYS,
    ContextScheduleEntry,
    DroppedSetting,
    FileKeys,
    FileVerdict,
    MixVerdict,
    ScheduleEntry,
)

SCHEMA_ID = "https://github.com/specledger/specledger/schemas/summary.schema.json"
#: a share in [0, 1]
Fraction = Annotated[float, Field(ge=0, le=1)]


class Provenance(FileModel):
    """Which code produced the file (specledger.provenance)."""

    REQUIRED = ("specledger_version", "git_commit", "git_dirty", "python", "torch")
    specledger_version: str = ""
    """specledger.__version__."""
    git_commit: Annotated[str, Field(pattern="^[0-9a-f]{40,64}$")] | None = None
    """HEAD of the git checkout the package ran from; null when it is not a checkout (an installed copy)."""
    git_dirty: bool | None = None
    """True when the checkout's work tree differed from HEAD (modified or untracked, non-ignored files); null when
    not a checkout."""
    python: str = ""
    """Python version."""
    torch: str | None = None
    """Installed torch version; null when torch is not installed."""


class PromptEntry(FileModel):
    """One prompt of the run: its category and length (its token ids stay in run.json)."""

    FORBIDDEN = ("token_ids",)
    category: str = ""
    """Its decision key."""
    prompt_tokens: int = 0
    """Its length in the target's tokens."""


class Bandwidth(FileModel):
    """Plain decoding's achieved memory bandwidth against the machine's (specledger.engine.bandwidth)."""

    bandwidth: str | None = None
    """The comparison in words."""


class RunRace(FileModel):
    """How the main job spent its budget (specledger.mainjob.race; a probe's race per configuration)."""

    budget_s: float = 0.0
    """The run's budget (s)."""
    spent_s: float = 0.0
    """Spent when the race stopped (s)."""
    rounds: list[dict[str, JsonValue]] = []
    """Rounds: run: after_s, category, temperature, added_prompts, with_plain, settings, why; probe: after_s, round,
    prompts per configuration."""
    dropped: list[DroppedSetting] = []
    """Settings dropped: category, temperature, label, after_prompts, after_s, why."""
    stopped: str = ""
    """Why it stopped."""


class SummaryMeta(FileModel):
    """run.json as written when the run started (model, machine, config, prompts, verify cost surface), except that
    each prompt keeps only its category and prompt_tokens: the token ids stay in run.json."""

    NEVER_NULL = ("name", "model", "kind", "dtype", "config", "provenance", "race", "bandwidth")
    name: str | None = None
    """Run folder name."""
    model: str | None = None
    """Target model."""
    kind: str | None = None
    """"probe" for a probe's summary (absent: a run)."""
    dtype: str | None = None
    """The target's weights as run ("fp32", "gguf Q4_K_M" ...)."""
    config: dict[str, JsonValue] | None = None
    """The run plan (specledger.mainjob.job.RunPlan), or the probe's options, as given."""
    prompts: dict[str, PromptEntry] = {}
    """Prompt id -> {category, prompt_tokens}."""
    provenance: Provenance | None = None
    """Which code measured the run."""
    traffic_mix: dict[str, float] | None = None
    """--mix: the traffic's shares per category (null: each category's share of the workload's requests)."""
    race: RunRace | None = None
    """A probe's race (specledger probe --budget)."""
    bandwidth: Bandwidth | None = None
    """Plain decoding's memory bandwidth."""


def measured_load(kind: str | None, config: Mapping[str, JsonValue] | None) -> int:
    """The concurrency at which a run's plain records were measured (``kind`` and ``config`` of its run.json): 1 for
    the main job (one request at a time); a probe's ``--concurrency`` for a probe at one load. A probe driven by
    ``--rate`` has no fixed concurrency; its verdict is read at the concurrency it reached, which the run does not
    record, so 1."""
    concurrency = (config or {}).get("concurrency")
    if kind == "probe" and concurrency and not (config or {}).get("rate"):
        return int(concurrency)  # type: ignore[arg-type]  # a whole number, as --concurrency takes
    return 1


class SloFigures(FileModel):
    """The SLO the gates and decisions used (specledger.gates.slo.SLO; defaults unless an SLO file was given):
    latency limits in ms, quality tolerance, alpha, equivalence_margin, target_load, …."""

    NEVER_NULL = ("ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "stall_ms", "equivalence_margin",
                  "decision_alpha", "min_ci_low")
    ttft_p99_ms: float | None = None
    """Time to first token, 99th percentile (ms)."""
    tpot_p50_ms: float | None = None
    """Time per output token, median (ms)."""
    tpot_p99_ms: float | None = None
    """Time per output token, 99th percentile, at loads > 1 (ms)."""
    itl_p99_ms: float | None = None
    """Token inter-token latency, 99th percentile, at loads > 1 (ms)."""
    stall_ms: float | None = None
    """Longest stall after the first token (ms)."""
    equivalence_margin: float | None = None
    """Practical-equivalence margin m of the paired comparisons (0.03 = 3 %)."""
    decision_alpha: float | None = None
    """The decisions' error rate over a whole race: every interval is a 1 − decision_alpha confidence sequence
    (absent in summaries before it: 95 % intervals)."""
    min_ci_low: float | None = None
    """The lower end of S's interval a deploy must clear."""
    target_load: int | None = None
    """The concurrency the service runs at: the verdict there leads (null: the lowest load)."""


class Intervals(FileModel):
    """How every S and paired ratio of the verdicts, the tables and the plots is estimated: level (1 −
    slo.decision_alpha), method, and what n counts. Measured figures carry their own n (verdicts' prompts,
    comparisons' n, scenarios' paired_prompts); simulated loads' S intervals are the simulator's, named in
    simulated."""

    level: float = 0.95
    """The intervals' confidence level."""
    method: str = ""
    """The estimator, in words."""
    n: str = ""
    """What each figure's n counts."""
    simulated: str = ""
    """The simulated loads' other estimator."""


class DisturbanceFinding(FileModel):
    """Whether the machine was disturbed while measuring: the windows watched, judged and disturbed."""

    REQUIRED = ("watched", "unit", "windows", "judged", "disturbed", "rule", "line")
    NEVER_NULL = ("remeasured", "remeasured_quiet", "handling")
    watched: bool = False
    """Whether anything was watched."""
    unit: Literal["prompt", "second", "load point"] = "prompt"
    """What a window is: 'prompt' for a run, 'second' for a probe, 'load point' for batched load points."""
    windows: Count = 0
    """Windows watched."""
    judged: Count = 0
    """Windows of at least thresholds.min_window_s."""
    disturbed: Count = 0
    """Judged windows found disturbed."""
    fraction: Fraction | None = None
    """Disturbed / judged (null: none judged)."""
    remeasured: Count | None = None
    """Windows measured again."""
    remeasured_quiet: Count | None = None
    """Of those, how many came out quiet."""
    rule: str = ""
    """The rule that judged them."""
    handling: str | None = None
    """What was done with a disturbed window."""
    line: str = ""
    """The sentence the answer and the report show."""


class LoadPointsFinding(DisturbanceFinding):
    """The load points' own finding (specledger run --loads): one window per batched point (setting × load > 1 ×
    temperature), judged by other processes' and steal's cores (no step drift); remeasured and remeasured_quiet
    count the points measured again and how many came out quiet; absent when no load point was watched."""

    unit: Literal["load point"] = "load point"
    """A batched load point."""


class Disturbance(DisturbanceFinding):
    """Whether the machine was disturbed while measuring (specledger.mainjob.disturbance): unit ('prompt' for a
    run, 'second' for a probe, 'load point' for a run whose load points alone were watched), windows, judged
    (windows of at least thresholds.min_window_s), disturbed, fraction (disturbed / judged), remeasured and
    remeasured_quiet (run: prompts measured again, and how many came out quiet), the signals' spread (other_cores,
    steal_cores, step_drift: median, p90, max), thresholds, rule, handling (what was done with a disturbed window)
    and line (the sentence the answer and the report show; with a clause on the load points when some were
    disturbed), and load_points (run --loads: the same entry over the batched load points, unit 'load point');
    absent when nothing was watched."""

    NEVER_NULL = (*DisturbanceFinding.NEVER_NULL, "load_points")
    load_points: LoadPointsFinding | None = None
    """The load points' own finding."""


class Summary(FileModel):
    """Every figure of a specledger run and its decisions (specledger.report.summary.summarize), written by
    `specledger run` and `specledger report DIR`. Read ``verdicts`` for the answer and ``schedules`` for the engine
    configs; docs/summary-json.md is the guide. Objects may carry keys not listed here (additionalProperties):
    consumers should ignore what they do not know."""

    REQUIRED = ("schema", "generated", "provenance", "meta", "slo", "requests", "experiment_requests", "experiments",
                "verdicts", "schedules", "loads", "simulated_loads", "simulation", "load_scenarios", "load_baselines",
                "baselines", "scenarios", "unpaired", "cost_models", "cost_points", "optimal_gamma", "prediction_check")
    NEVER_NULL = ("disturbance", "race", "run_dir")
    format: Annotated[str, Field(pattern=r"^specledger\.summary/[0-9]+$")] = Field("", alias="schema")
    """The format's name and version, "specledger.summary/1"."""
    generated: str = ""
    """When the summary was built (ISO 8601, UTC)."""
    provenance: Provenance = Field(default_factory=Provenance)
    """Which code produced the file."""
    meta: SummaryMeta = Field(default_factory=SummaryMeta)
    """run.json as written when the run started (each prompt without its token ids)."""
    slo: SloFigures = Field(default_factory=SloFigures)
    """The SLO the gates and decisions used."""
    intervals: Intervals = Field(default_factory=Intervals)
    """How every S and paired ratio is estimated."""
    requests: Count = 0
    """Main-job requests analysed."""
    experiment_requests: Count = 0
    """Side-experiment requests left out of the main analysis."""
    experiments: dict[str, JsonValue] = {}
    """Side experiments' results as written (quantization, policies, serving, simulate) and endpoint figures
    (probe, vllm_bench, guidellm), by key."""
    verdicts: list[FileVerdict] = []
    """THE ANSWER: one decision per (category, temperature, load), load 1 first."""
    schedules: list[ScheduleEntry] = []
    """The decisions folded over loads per (category, temperature), with paste-ready engine configs."""
    loads: list[Load] = []
    """Measured loads (concurrencies)."""
    simulated_loads: list[Load] = []
    """Loads decided by the simulator."""
    simulation: dict[str, JsonValue] | None = None
    """How the simulated loads were priced and validated; null when none were simulated."""
    load_scenarios: list[SettingRow] = []
    """Speculative settings at loads > 1 (measured, then simulated)."""
    load_baselines: list[SettingRow] = []
    """Plain decoding at measured loads > 1."""
    baselines: list[SettingRow] = []
    """Plain decoding per (category, temperature) at load 1."""
    scenarios: list[SettingRow] = []
    """Every speculative setting per (category, temperature) at load 1."""
    unpaired: list[str] = []
    """Labels of settings with no plain baseline on the same prompts."""
    cost_models: dict[str, JsonValue] = {}
    """The run's fitted cost model per drafter (verify, draft, other)."""
    cost_points: dict[str, JsonValue] = {}
    """Measured verify costs per drafter, the points the cost model was fitted on."""
    optimal_gamma: list[OptimalGamma] = []
    """Predicted vs measured best γ per (category, temperature, drafter)."""
    trees: list[dict[str, JsonValue]] = []
    """Token-tree rounds against chains, one row per tree setting (only when the run had tree budgets)."""
    prediction_check: PredictionCheck = Field(default_factory=PredictionCheck)
    """Leave-one-γ-out check of the forecasts: rows, median/p90/max absolute error."""
    mix: list[MixVerdict] = []
    """One setting for the traffic as a whole (specledger.gates.mix), one entry per temperature, absent (empty)
    with fewer than 2 categories: a verdict (same keys and rule as verdicts, category 'all traffic') decided on the
    speed-up of the mix, the ratio of share-weighted per-request totals, paired per category (stratified interval);
    weights (each category's share of requests, or --mix) and settings (setting, speedup, speedup_ci, per_category
    speed-ups)."""
    disturbance: Disturbance | None = None
    """Whether the machine was disturbed while measuring; absent when nothing was watched."""
    race: RunRace | None = None
    """How the main job spent its budget: budget_s, spent_s, rounds (after_s, category, temperature, added_prompts,
    with_plain, settings, why), dropped settings, why it stopped; absent in runs without racing."""
    run_dir: str | None = None
    """The run folder the summary was built from (absent when built from records alone)."""
    context_schedules: list[ContextScheduleEntry] = []
    """Per category decided in two or more context buckets: its buckets in length order and where speculation
    stops (or starts) paying, counting resolved decisions only (specledger.gates.context_schedule)."""

    @classmethod
    def read(cls, summary: Summary | dict[str, Any]) -> Summary:
        """``summary.json``'s content (as :func:`specledger.report.summary.summarize` returns it) typed; a
        :class:`Summary` as it is."""
        if isinstance(summary, Summary):
            return summary
        try:
            return cls.model_validate(summary)
        except ValidationError as e:  # a summary this version did not write, or a bug: one line, nothing lost
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the top level"
            raise SpecLedgerError(f"the summary does not match summary.json's schema ({e.error_count()} "
                                  f"problem{'s' if e.error_count() > 1 else ''}; first at {where}: {first['msg']}); "
                                  "rebuild it with `specledger report RUN_DIR` from this version") from None

    @property
    def solo_load(self) -> int:
        """The load the solo scenarios were measured at (:func:`measured_load`)."""
        return measured_load(self.meta.kind, self.meta.config)


class _SchemaFile(GenerateJsonSchema):
    """The file's schema as the checked-in file holds it: draft 2020-12, its id, no generated titles."""

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        out = super().generate(schema, mode)
        return {"$schema": self.schema_dialect, "$id": SCHEMA_ID, "title": "specledger summary.json",
                **{k: v for k, v in out.items() if k != "title"}}

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> JsonSchemaValue:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out

    def dataclass_schema(self, schema: Any) -> JsonSchemaValue:
        """One of the gates' dataclasses (a verdict and its parts) as the file holds it (:data:`FILE_KEYS`)."""
        out = super().dataclass_schema(schema)
        out.pop("title", None)
        FILE_KEYS.get(schema["cls"], FileKeys()).apply(out, schema["cls"])
        return out


def summary_schema() -> dict[str, JsonValue]:
    """``summary.json``'s JSON Schema (draft 2020-12), generated from :class:`Summary`."""
    return Summary.model_json_schema(schema_generator=_SchemaFile)


def summary_schema_text() -> str:
    """:func:`summary_schema` as the checked-in file holds it (indented, UTF-8, a final newline)."""
    return json.dumps(summary_schema(), indent=2, ensure_ascii=False) + "\n"


__all__ = ["SCHEMA_ID", "Bandwidth", "Disturbance", "DisturbanceFinding", "Intervals", "LoadPointsFinding",
           "PromptEntry", "Provenance", "RunRace", "SloFigures", "Summary", "SummaryMeta", "measured_load",
           "summary_schema", "summary_schema_text"]
