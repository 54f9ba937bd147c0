"""The serving experiment's JSON objects (``serving.json``), by their keys: a load point, what is read across
points (crossovers, policies against statics, the deploy table and configs) and the whole sweep. Plain dicts at
run time. Times in milliseconds unless the key says ``_s``, sizes in bytes, throughput in output tokens per
second of wall time."""

from __future__ import annotations

from typing import Any, TypedDict

from specledger.bench.experiment import ExperimentHeaderDict, GreedyPromptFieldsDict
from specledger.records import GammaSpec

#: a latency distribution of :func:`specledger.analysis.stats.distribution`: n, mean, max and percentiles
LatencyFigures = dict[str, float | int | None]


class RepeatDict(TypedDict):
    """One repeat of a point: its tokens, wall time and throughput."""

    tokens: int
    wall_s: float
    throughput_tok_s: float


class DraftMemoryDict(TypedDict):
    """What the point's drafters allocated: a model drafter's own weights and KV (0 for model-free ones)."""

    weight_bytes: int
    kv_bytes_per_request_max: int  # the largest draft cache one request allocated
    kv_bytes_per_token: int  # the draft model's m_KV
    max_context_tokens: int  # the longest prompt + output served


class _CandidateMemoryKeys(TypedDict):
    m_kv_bytes_per_token: int
    predicted_candidate_kv_bytes: int  # B · γ · m_KV
    engine_peak_candidate_kv_bytes: int
    relative_difference: float | None
    batch: int
    gamma: int
    static_slot_cache_bytes: int  # slots · slot capacity · m_KV, allocated with or without speculation
    note: str


class DraftLedgerDict(TypedDict, total=False):
    """A model drafter's own memory, predicted against allocated (empty for model-free drafters)."""

    draft_weight_bytes: int
    predicted_draft_kv_bytes: int
    engine_draft_kv_bytes: int
    draft_kv_relative_difference: float | None
    predicted_total_extra_bytes: int
    engine_total_extra_bytes: int
    draft_note: str


class MemoryLedgerDict(_CandidateMemoryKeys, DraftLedgerDict):
    """Predicted candidate KV against what the engine reserved at its peak; a model drafter's own memory too."""


class SpeedupDict(TypedDict):
    """A setting's speed-up over plain at the same load: pooled throughput ratio, per-repeat paired ratios and
    their 95 % t-interval (None with one repeat)."""

    speedup: float | None
    speedup_repeats: list[float]
    speedup_ci: list[float] | None


class _PointMetricsKeys(TypedDict):
    requests: int
    tokens: int
    wall_s: float
    throughput_tok_s: float
    ttft_ms: LatencyFigures
    tpot_ms: LatencyFigures
    itl_token_ms: LatencyFigures
    itl_chunk_ms: LatencyFigures
    tokens_per_chunk: LatencyFigures
    longest_stall_ms: float | None
    mean_batch: float
    mean_rows_per_step: float
    t_forward_ms_per_step: float
    peak_batch: int
    slots: int  # the engine's sequence slots
    slot_capacity: int  # positions per slot
    preemptions: int
    el: float  # committed tokens per full round
    peak_reserved_tokens: int
    peak_candidate_tokens: int


class ServingPointDict(_PointMetricsKeys, SpeedupDict, total=False):
    """One setting at one load: its measured figures (:func:`~specledger.bench.serving_metrics.point_metrics`),
    then where it sits (kind, load, setting; a context point's source and concurrency), its repeats, its speed-up
    over plain and (a speculative static γ) its memory ledger."""

    cpu_s: float  # this process's CPU time over the point
    draft_memory: DraftMemoryDict
    repeats: list[RepeatDict]
    kind: str  # "concurrency", "rate" or "context"
    load: float  # the concurrency, the rate (req/s) or the context length (tokens)
    drafter: str
    gamma: GammaSpec
    setting: str
    source: str | None  # a context point's long-input source
    concurrency: int | None  # a context point's concurrency
    memory: MemoryLedgerDict


class ContextPositionDict(TypedDict, total=False):
    """Where a context point sits in its grid (empty for other kinds)."""

    source: str | None
    concurrency: int | None


class ContextCrossoverDict(TypedDict):
    """One drafter's concurrency crossover at one source and context length."""

    source: str | None
    length: float  # tokens
    setting: str
    crossover_concurrency: float | None  # the lowest concurrency with speed-up < 1; None: never below 1
    speedup_by_concurrency: dict[str, float | None]


class PolicyVsStaticDict(ContextPositionDict):
    """A dynamic policy against the best static choice in hindsight at one load."""

    kind: str
    load: float
    policy: str
    best_static: str
    ratio: float | None  # the policy's pooled throughput over the best static's
    ci: list[float] | None
    repeats: int
    ratios: list[float]
    at_least_as_good: bool
    policy_speedup: float | None
    best_static_speedup: float | None


class _SweepPointKeys(TypedDict):
    concurrency: list[ServingPointDict]
    rate: list[ServingPointDict]
    context: list[ServingPointDict]
    crossover: dict[str, dict[str, float | None]]


class ServingSweepDict(_SweepPointKeys, total=False):
    """Every load point of the sweep and what is read across them (the last two once every point is in);
    ``crossover``: kind -> setting -> the lowest load with speed-up < 1 (None: never below 1)."""

    context_crossover: list[ContextCrossoverDict]
    policy_vs_static: list[PolicyVsStaticDict]


class DeployRowDict(ContextPositionDict):
    """The deploy table's decision at one load: the fastest setting where it beats plain, else "off"."""

    kind: str
    load: float
    decision: str  # "deploy" or "off"
    drafter: str | None
    gamma: GammaSpec
    setting: str
    speedup: float | None
    speedup_ci: list[float] | None
    best_candidate: str | None
    throughput_tok_s: float | None


class VllmDeployDict(TypedDict):
    """vLLM's ``--speculative-config`` value (None: leave speculation off) and how to read it."""

    speculative_config: dict[str, Any] | None
    note: str


class DeployConfigsDict(TypedDict):
    """Paste-ready settings for the best drafter overall; an engine's config None where it cannot run it."""

    best_drafter: str | None
    gamma: int | None
    gamma_by_concurrency: dict[int, int]  # concurrency -> γ, or 0 for plain
    vllm: VllmDeployDict | None
    trtllm: dict[str, Any] | None
    sglang: list[str] | None  # argv
    llama_cpp: list[str] | None  # argv
    sglang_note: str
    configs_note: str


class ServingDocDict(ExperimentHeaderDict, GreedyPromptFieldsDict, ServingSweepDict):
    """``serving.json``: the settings asked, every point and what is read across them, the deploy table and
    configs."""

    drafters: list[str]  # settings, "drafter γ=4"
    concurrencies: list[int]
    rates: list[float]  # req/s
    context_lengths: list[int]  # tokens
    context_concurrency: int
    context_concurrencies: list[int]
    context_sources: list[str]
    max_tokens: int
    repeats: int
    deploy_table: list[DeployRowDict]
    deploy: DeployConfigsDict
