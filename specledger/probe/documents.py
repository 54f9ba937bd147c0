"""The JSON documents a probe writes and reads back, by their keys: one endpoint's report (``probe.json``'s
``probe`` / ``baseline``), its summary figures (shared with the ``vllm bench serve`` and guidellm imports), the
per-request results, the load configuration.

They are TypedDicts: at run time plain dicts, written to JSON as they are, so every file keeps its keys and
their order; a checker reads the keys. Times are in milliseconds where a key ends in ``_ms``, seconds in ``_s``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from specledger.probe.wire import EngineSpecStats, LlamaTimings


class LoadConfigDoc(TypedDict):
    """:class:`~specledger.probe.loadgen.LoadConfig` as written to probe.json / run.json (``config``): every
    field in declaration order, the header values left out (their names only)."""

    base_url: str
    model: str
    chat: bool
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str] | None
    concurrency: int | None
    rate: float | None  # requests per second (open loop)
    num_requests: int
    duration_s: float | None
    arrival_seed: int
    timeout_s: float
    include_usage: bool
    deadline_s: float | None
    header_names: list[str]


class RequestResultDoc(TypedDict):
    """:meth:`~specledger.probe.loadgen.RequestResult.to_dict`: one request, every field (seconds)."""

    index: int
    ok: bool
    status: int | None
    error: str | None
    start_s: float
    end_s: float
    ttft_s: float | None
    chunk_times: list[float]
    chunk_tokens: list[int]
    chunk_chars: list[int]
    output_text: str
    completion_tokens: int
    usage_completion_tokens: int | None
    token_count_source: str
    saw_done: bool
    finish_reason: str | None
    prompt_id: str | None
    reasoning_text: str
    server_timings: LlamaTimings | None
    server_spec: EngineSpecStats | None


class LatencyFigures(TypedDict, total=False):
    """One latency distribution in ms (:func:`specledger.analysis.stats.distribution`: n, mean, P50/P95/P99,
    max; an import gives the ones its file has). None where there is no sample."""

    n: float | None
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class ResponseTimingsFigures(TypedDict):
    """llama.cpp's per-response draft counts pooled over responses
    (:func:`specledger.probe.metrics.response_timings_figures`)."""

    source: str
    responses: int
    num_draft_tokens: float
    num_accepted_tokens: float
    draft_acceptance_rate: float | None  # Σ accepted / Σ drafted
    mean_request_acceptance_rate: float | None  # mean over responses of accepted / drafted


class ResponseTimingsTotals(TypedDict, total=False):
    """llama.cpp's ``timings`` (last snapshot per response) added up over responses
    (:func:`specledger.probe.metrics.response_timings_totals`); None for a field no response carries."""

    responses: int
    cache_n: int | float | None
    prompt_n: int | float | None
    prompt_ms: float | None
    predicted_n: int | float | None
    predicted_ms: float | None
    draft_n: int | float | None
    draft_n_accepted: int | float | None


class SpecDecodeDoc(TypedDict, total=False):
    """Spec-decode figures as written (:class:`specledger.probe.spec_figures.SpecDecodeFigures`, or a ``vllm
    bench serve`` result's): counts over a window, the pooled acceptance length (bonus token counted), the
    per-position rates Pr(K >= i) and their conditional chain, the caveats."""

    source: str | None
    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    mean_acceptance_length: float | None
    mean_accepted_per_draft: float | None
    draft_acceptance_rate: float | None
    per_position_rates: list[float]
    conditional_rates: list[float | None]
    sglang_accept_length: float | None
    sglang_accept_rate: float | None
    off: bool
    warnings: list[str]


class EndpointSummary(TypedDict, total=False):
    """The summary figures of one endpoint (:func:`specledger.probe.metrics.summarize`) or of one imported
    result (:meth:`specledger.probe.vllm_bench.VllmBenchResult.summary`,
    :func:`specledger.probe.guidellm.benchmark_summary`: the same keys where they measure the same thing,
    plus their own)."""

    source: str  # imports: "vllm bench serve", "guidellm"
    strategy: str | None  # guidellm
    requests_total: int
    requests_ok: int | None
    requests_failed: int | None
    requests_incomplete: int | None  # guidellm
    errors: dict[str, int]  # failed requests by kind
    wall_time_s: float | None
    total_output_tokens: float | None
    output_throughput_tok_s: float | None
    request_throughput_req_s: float | None
    request_goodput_req_s: float | None  # vllm bench
    ttft_ms: LatencyFigures
    tpot_ms: LatencyFigures
    tpot_incl_ttft_ms: LatencyFigures  # guidellm
    pooled_tpot_ms: float | None
    token_itl_ms: LatencyFigures
    chunk_itl_ms: LatencyFigures
    e2el_ms: LatencyFigures  # imports
    longest_stall_ms: float | None
    mean_tokens_per_chunk: float | None
    tokens_per_chunk_per_request: LatencyFigures  # guidellm
    per_request_records: int  # guidellm
    requests_without_done: int
    response_timings: ResponseTimingsFigures | None
    conventions: dict[str, str]  # figure -> how it is measured
    spec_decode: SpecDecodeDoc | None  # imports
    spec_decode_note: str | None  # imports: why there is none


class Speedup(TypedDict):
    """A candidate endpoint against its baseline (:func:`specledger.probe.metrics.speedup`): > 1 is faster."""

    throughput_ratio: float | None  # candidate / baseline output tok/s
    tpot_ratio: float | None  # baseline / candidate pooled TPOT
    ttft_p50_ratio: float | None  # baseline / candidate TTFT P50


class SpecCountersSnapshot(TypedDict):
    """One ``/metrics`` scrape's spec-decode counters (summed over labels), as a probe report keeps them
    (``spec_decode_counters.before`` / ``.after``); ``accepted_per_pos``: position (as a string) -> count."""

    engine: str
    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    accepted_per_pos: dict[str, float]


class SpecCountersWindow(TypedDict):
    """The counters scraped before and after one endpoint's load (None: no spec-decode counters seen)."""

    before: SpecCountersSnapshot | None
    after: SpecCountersSnapshot | None


class LatencyHistogramSummary(TypedDict):
    """A server latency histogram over a window (:func:`specledger.probe.histograms.latency_histogram_summaries`),
    seconds."""

    metric: str
    definition: str
    count: float
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    approximate: str


class CounterRate(TypedDict):
    """Δnumerator / Δdenominator of an engine's counter pair over a window
    (:func:`specledger.probe.histograms.counter_rates`)."""

    numerator: str
    denominator: str
    value: float | None


class EndpointReport(TypedDict, total=False):
    """One endpoint's part of ``probe.json`` (:func:`specledger.probe.endpoint.probe_endpoint_results`); a
    configuration's repeats merged (:func:`specledger.probe.launch_runs.merge_repeats`) add ``repeats``,
    ``windows`` and ``spec_decode_note``."""

    url: str
    model: str
    config: LoadConfigDoc
    summary: EndpointSummary
    spec_decode: SpecDecodeDoc | None
    server_histograms: dict[str, LatencyHistogramSummary]
    warnings: list[str]
    results: list[RequestResultDoc]
    spec_decode_counters: SpecCountersWindow | None
    server_rates: dict[str, CounterRate]
    repeats: int
    windows: list[tuple[SpecCountersSnapshot | None, SpecCountersSnapshot | None]]
    spec_decode_note: str | None


#: an endpoint's part in a probe: the probed one or its baseline
Side = Literal["probe", "baseline"]


class ProbeDocument(TypedDict, total=False):
    """One probe's figures: ``probe.json`` of a probe at one load, one load's entry of a probe at several
    (:class:`specledger.probe.endpoint_loads.LoadPoint`'s ``full``)."""

    probe: EndpointReport
    baseline: EndpointReport
    speedup: Speedup
    disturbance: dict[str, Any]  # the machine watch's finding (specledger.mainjob.disturbance.window_finding)


__all__ = ["CounterRate", "EndpointReport", "EndpointSummary", "LatencyFigures",
           "LatencyHistogramSummary", "LoadConfigDoc", "ProbeDocument", "RequestResultDoc", "ResponseTimingsFigures",
           "ResponseTimingsTotals", "Side", "SpecCountersSnapshot", "SpecCountersWindow", "SpecDecodeDoc", "Speedup"]
