"""``summary.json``'s figure rows as types: one setting on one (category, temperature) at one load
(:class:`SettingRow`: ``baselines``, ``scenarios``, ``load_scenarios``, ``load_baselines``), with its totals, round
ledger, latency and gates; the forecast's best γ per drafter (:class:`OptimalGamma`) and its self-check
(:class:`PredictionCheck`). :mod:`specledger.report.summary_model` builds the whole file on these.

Every type here is a :class:`FileModel`: read leniently (each field has the default a reader takes for a key a
summary written before it existed lacks; keys not listed are kept), while the JSON Schema generated from it
(:func:`specledger.report.summary_model.summary_schema`) requires what every summary written now carries
(``REQUIRED``) and allows null only where a file may hold null (``NEVER_NULL`` lists the fields that read None when
absent but are never null in a file); ``FORBIDDEN`` keys a file must not carry. Analysis dicts nested here are
open-ended: the main keys are typed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.json_schema import JsonDict

#: γ: candidates proposed per round, or the name of an adaptive policy ("heuristic", "ema"); 0 for plain decoding
Gamma = int | str
#: a two-sided interval (low, high); either end None where it could not be computed
Interval = tuple[float | None, float | None]
#: a whole count of something (prompts, requests, rounds)
Count = Annotated[int, Field(ge=0)]
#: concurrent requests
Load = Annotated[int, Field(ge=1)]


def file_schema(schema: JsonDict, required: Sequence[str] = (), never_null: Sequence[str] = (),
                forbidden: Sequence[str] = ()) -> None:
    """An object's JSON Schema as a file must hold it: the ``required`` keys required (without the default a reader
    takes), the ``never_null`` fields without the null a reader's default adds, the ``forbidden`` keys refused;
    every description on one line."""
    properties = schema["properties"]
    assert isinstance(properties, dict)
    if required:
        schema["required"] = list(required)
    for name in never_null:
        prop = properties[name]
        assert isinstance(prop, dict) and isinstance(prop["anyOf"], list)
        kinds = [k for k in prop.pop("anyOf") if isinstance(k, dict) and k.get("type") != "null"]
        prop.pop("default", None)
        prop.update(kinds[0] if len(kinds) == 1 else {"anyOf": kinds})
    for name, prop in properties.items():
        if isinstance(prop, dict):
            if name in required:
                prop.pop("default", None)
            if isinstance(prop.get("description"), str):
                prop["description"] = " ".join(str(prop["description"]).split())
    for name in forbidden:
        properties[name] = False
    if isinstance(schema.get("description"), str):
        schema["description"] = " ".join(str(schema["description"]).split())


def _file_schema(schema: JsonDict, model: type[Any]) -> None:
    """A :class:`FileModel`'s JSON Schema (:func:`file_schema` of its ``REQUIRED``, ``NEVER_NULL`` and
    ``FORBIDDEN``)."""
    file_schema(schema, model.REQUIRED, model.NEVER_NULL, model.FORBIDDEN)


class FileModel(BaseModel):
    """A part of ``summary.json`` (see the module doc: lenient to read, strict as a schema)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True, json_schema_extra=_file_schema,
                              populate_by_name=True, defer_build=True)  # built on first read: imports stay cheap
    #: the keys every summary written now carries (the schema's ``required``)
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    #: fields that read None when absent but are never null in a file
    NEVER_NULL: ClassVar[tuple[str, ...]] = ()
    #: keys a file must not carry here
    FORBIDDEN: ClassVar[tuple[str, ...]] = ()


class Keyed(FileModel):
    """A part of the summary that belongs to one decision: a (category, temperature)."""

    category: str = ""
    """Workload category ("CATEGORY@BUCKET" where decided per context bucket, "all traffic" for the mix)."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy)."""

    @property
    def key(self) -> tuple[str, float]:
        """(category, temperature): the decision it belongs to."""
        return self.category, float(self.temperature)


class KeyedAtLoad(Keyed):
    """A decision's part at one load."""

    NEVER_NULL = ("load",)
    load: Load | None = None
    """Concurrent requests it was measured, simulated or decided at (absent: 1, one request at a time)."""

    @property
    def at_load(self) -> int:
        """Its load: 1 where unset."""
        return int(self.load or 1)


class Distribution(FileModel):
    """A sample's summary (ms unless the key says otherwise); statistics are null on an empty sample."""

    n: Count = 0
    """Sample size."""
    mean: float | None = None
    """Arithmetic mean."""
    p50: float | None = None
    """Median."""
    p95: float | None = None
    """95th percentile."""
    p99: float | None = None
    """99th percentile."""
    max: float | None = None
    """Largest value."""


class Ecdf(FileModel):
    """Plot data for the latency ECDFs: per metric, the sample's quantiles at m = min(n, 101) evenly spaced
    probabilities 0, 1/(m−1), …, 1 (for n ≤ 101 the sorted sample itself), 4 significant digits."""

    __pydantic_extra__: dict[str, list[float]] = Field(init=False)  # type: ignore[assignment]
    ttft: Annotated[list[float], Field(max_length=101)] = []
    """Time to first token."""
    tpot: Annotated[list[float], Field(max_length=101)] = []
    """Time per output token."""
    itl_chunk: Annotated[list[float], Field(max_length=101)] = []
    """Inter-chunk latency."""


class Latency(FileModel):
    """Latency figures of the setting's requests (specledger.analysis.metrics.latency_stats)."""

    ttft_ms: Distribution = Field(default_factory=Distribution)
    """Time to first token per request."""
    tpot_ms: Distribution = Field(default_factory=Distribution)
    """Time per output token after the first, per request: (total − TTFT)/(tokens − 1)."""
    itl_token_ms: Distribution = Field(default_factory=Distribution)
    """Inter-token latency, token level (zero gaps inside a chunk included)."""
    itl_chunk_ms: Distribution = Field(default_factory=Distribution)
    """Inter-chunk latency: what a streaming client waits between updates."""
    tokens_per_chunk: Distribution = Field(default_factory=Distribution)
    """Tokens per streamed chunk."""
    longest_stall_ms: float | None = None
    """Largest chunk gap after the first token, over all requests."""
    ecdf_ms: Ecdf = Field(default_factory=Ecdf)
    """Plot data for the latency ECDFs."""


class Totals(FileModel):
    """Sums over the setting's requests."""

    requests: Count = 0
    """Requests."""
    tokens: float = 0.0
    """Output tokens committed."""
    total_time_s: float = 0.0
    """Σ request time (s)."""
    tokens_per_s: float | None = None
    """Σ tokens / Σ time (null when no time was measured)."""
    mean_of_request_speeds: float | None = None
    """The unweighted mean of per-request speeds: kept only to show how far it is from tokens_per_s."""


class AcceptancePoint(FileModel):
    """The conditional acceptance at one candidate position j."""

    position: int = 0
    """j, from 1."""
    a: float | None = None
    """a_j = Pr(K ≥ j | K ≥ j−1); null where no round reached j."""
    at_risk: Count = 0
    """Rounds that reached position j."""


class Rounds(FileModel):
    """The speculative ledger of the setting's rounds (specledger.analysis.metrics.round_stats); the main figures
    are described, others may appear."""

    rounds: int = 0
    """Rounds (draft + verify steps)."""
    full_rounds: int = 0
    """Rounds not cut by the output budget or a stop."""
    el_full: float | None = None
    """E[L]: tokens committed per full round."""
    acceptance_rate: float | None = None
    """Accepted / proposed candidates."""
    conditional_acceptance: list[AcceptancePoint] = []
    """a_j per candidate position j."""
    k_histogram: list[int] = []
    """Rounds by number of accepted candidates k = 0, 1, …."""
    t_draft_ms: float | None = None
    """Mean drafting time per round."""
    t_verify_ms: float | None = None
    """Mean verify (target forward) time per round."""
    t_other_ms: float | None = None
    """Mean remaining engine time per round."""
    t_round_ms: float | None = None
    """Mean time per full round."""


class Gate(FileModel):
    """One gate's outcome (specledger.gates.result.GateResult)."""

    REQUIRED = ("status", "evidence")
    name: str = ""
    """The gate."""
    status: Literal["pass", "fail", "not assessed"] = "not assessed"
    """"pass", "fail" or "not assessed" (nothing measured to decide it: never counted as a pass)."""
    evidence: str = ""
    """The figures that decided it, as one sentence."""
    marginal: list[str] = []
    """Checks that pass or fail only within the SLO's margin."""


class SettingRow(KeyedAtLoad):
    """The figures of one setting (drafter, γ, tree budget) on one (category, temperature) at one load: plain
    decoding in ``baselines``, speculative settings in ``scenarios``. Analysis dicts nested here are open-ended:
    the main keys are described."""

    REQUIRED = ("category", "temperature", "drafter", "gamma", "label")
    NEVER_NULL = ("load", "simulated", "paired_prompts")
    drafter: str = "none"
    """Drafter ("none" = plain decoding)."""
    gamma: Gamma | None = 0
    """γ: candidates proposed per round (an integer), or the name of an adaptive policy; 0 for plain decoding; null
    where a probe's configuration does not say."""
    tree_budget: int = 0
    """Token-tree node budget per round; 0 = a chain."""
    label: str = ""
    """Human label, e.g. "code T=0 ngram γ=2" ("@ load 16" at loads > 1)."""
    simulated: bool | None = None
    """True when the row comes from the simulator, not a measurement."""
    paired_prompts: int | None = None
    """Prompts both this setting and plain decoding ran."""
    speedup: float | None = None
    """S: paired speed-up over plain decoding (Σ tokens/Σ time ratio on shared prompts); null without shared
    prompts."""
    speedup_ci: Interval = (None, None)
    """The decisions' interval of S at 1 − slo.decision_alpha over the paired_prompts (summary `intervals`); for a
    simulated row, the simulator's (prompt bootstrap widened by its error)."""
    totals: Totals = Field(default_factory=Totals)
    """Sums over the setting's requests."""
    rounds: Rounds = Field(default_factory=Rounds)
    """The round ledger."""
    latency: Latency = Field(default_factory=Latency)
    """Latency figures."""
    gates: dict[str, Gate] = {}
    """The four gates of a setting by name: correctness, quality, latency, capacity."""
    t0_ms: float | None = None
    """T0: plain decoding's time per committed token (ms)."""
    memory_bytes: float | None = None
    """Peak memory of the run or the setting (bytes)."""
    paired_tokens_per_s: float | None = None
    """Tokens/s of this setting on the shared prompts."""
    baseline_tokens_per_s: float | None = None
    """Tokens/s of plain decoding on the shared prompts."""
    reconciliation: dict[str, JsonValue] | None = None
    """Where the round time goes against T0·E[L] (object; null without shared prompts)."""
    reconciliation_text: list[str] = []
    """The reconciliation as sentences."""
    why: list[str] = []
    """Why the setting is as fast as it is, as sentences."""
    per_prompt: dict[str, JsonValue] = {}
    """Per-prompt totals both sides ran (the paired decisions' input): prompts, tokens, seconds, base_tokens,
    base_seconds, aligned."""
    predicted_speedup_e2e: float | None = None
    """The end-to-end model's forecast of S (specledger.predict)."""
    prediction_kind: str | None = None
    """How that forecast was made ("held out", "in sample")."""


class CurvePoint(FileModel):
    """The forecast model's S at one γ."""

    gamma: int = 0
    """γ."""
    speedup: float | None = None
    """Forecast S."""


class OptimalGamma(FileModel):
    """Predicted vs measured best γ of one drafter on one (category, temperature)."""

    category: str = ""
    """Workload category."""
    temperature: float = 0.0
    """Sampling temperature."""
    drafter: str = ""
    """The drafter."""
    curve: list[CurvePoint] = []
    """The forecast model's S(γ), in sample, on the prompts measured with plain."""
    predicted_best_gamma: int | None = None
    """The γ the curve peaks at."""
    prompts: int | None = None
    """Prompts the curve is priced on."""


class MachineNoise(FileModel):
    """The machine's noise beside the forecast's error: plain steps' spread."""

    p10_ms: float = 0.0
    """10th percentile of a plain step."""
    p50_ms: float = 0.0
    """Median plain step."""
    p90_ms: float = 0.0
    """90th percentile of a plain step."""
    busy: bool = False
    """The spread says the machine was busy: speed figures are unreliable."""


class PredictionCheck(FileModel):
    """The forecasts' self-check (specledger.predict.check): each γ held out of the end-to-end model."""

    n: int = 0
    """Settings held out."""
    median_abs_error: float | None = None
    """Median |forecast − measured| / measured S."""
    p90_abs_error: float | None = None
    """Its 90th percentile."""
    max_abs_error: float | None = None
    """Its largest."""
    machine_noise: MachineNoise | None = None
    """The machine's noise while measuring (null: not measured)."""
    rows: list[dict[str, JsonValue]] = []
    """One row per setting held out: forecast, measurement and their error."""


__all__ = ["AcceptancePoint", "Count", "CurvePoint", "Distribution", "Ecdf", "FileModel", "Gamma", "Gate",
           "Interval", "Keyed", "KeyedAtLoad", "Latency", "Load", "MachineNoise", "OptimalGamma", "PredictionCheck",
           "Rounds", "SettingRow", "Totals", "file_schema"]
