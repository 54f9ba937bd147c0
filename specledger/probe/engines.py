"""Which Prometheus names each serving engine exports, mapped to ledger quantities (one table per engine).

The readers in :mod:`specledger.probe.prometheus` (saved dumps, ``specledger inspect``, and the live
``probe``) look names up here only; nothing else in the package spells an engine's metric name.
Counters are matched with or without the ``_total`` suffix, histograms by ``_bucket``/``_sum``/``_count``.
Where each name comes from (read from the engines' documentation and source; the versions are those
whose names we followed):

* **vLLM v1** (v0.8 - v0.11): ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``) defines the
  counters ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
  ``..._num_accepted_tokens_per_pos{position="0".."k-1"}``; ``vllm/v1/metrics/loggers.py``
  (``PrometheusStatLogger``) defines the histograms ``vllm:time_to_first_token_seconds``,
  ``vllm:inter_token_latency_seconds`` (called ``vllm:time_per_output_token_seconds`` up to v0.10:
  the same per-token gap), ``vllm:request_time_per_output_token_seconds`` (per-request TPOT),
  ``vllm:e2e_request_latency_seconds`` and the counter ``vllm:generation_tokens``.
* **vLLM v0** (v0.4 - v0.7, ``vllm/engine/metrics.py``): gauges ``vllm:spec_decode_draft_acceptance_rate``
  and ``vllm:spec_decode_efficiency``, counters ``vllm:spec_decode_num_draft_tokens``,
  ``..._num_accepted_tokens`` and ``..._num_emitted_tokens`` (no drafts counter: each round emits its
  accepted tokens plus one, so drafts = emitted - accepted).
* **SGLang** (v0.4 - v0.5, ``python/sglang/srt/metrics/collector.py``): ``SchedulerMetricsCollector``
  gauges ``sglang:spec_accept_length`` (accepted tokens per verify step, the bonus token counted, so a
  measurement is >= 1; SGLang exports 0 when speculation is off) and ``sglang:spec_accept_rate`` (0 when
  off); ``TokenizerMetricsCollector`` histograms ``sglang:time_to_first_token_seconds``,
  ``sglang:inter_token_latency_seconds`` (``sglang:time_per_output_token_seconds`` before v0.4.4),
  ``sglang:e2e_request_latency_seconds`` and the counter ``sglang:generation_tokens``.
* **llama.cpp** (``tools/server/server.cpp``, ``handle_metrics``; builds of 2025): counters
  ``llamacpp:tokens_predicted``, ``llamacpp:tokens_predicted_seconds``, ``llamacpp:prompt_tokens``,
  ``llamacpp:prompt_seconds``, ``llamacpp:n_decode``; gauges ``llamacpp:predicted_tokens_seconds`` and
  ``llamacpp:prompt_tokens_seconds``; and, on servers with a draft model, the spec-decode counters
  ``llamacpp:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
  ``..._num_accepted_tokens_per_pos{position="0".."63"}`` (vLLM's meaning; every position up to 63 is
  exported, so trailing all-zero positions are trimmed). Per response, ``timings.draft_n`` and
  ``timings.draft_n_accepted`` (``result_timings`` in the same file) are read by :mod:`~specledger.probe.sse`.
* **TGI** (v2 - v3, ``router/src/server.rs`` and ``router/src/infer/mod.rs``): histograms
  ``tgi_request_duration`` (end to end), ``tgi_request_mean_time_per_token_duration`` (per-request mean
  time per token), ``tgi_request_queue_duration``, ``tgi_request_inference_duration``, and the counters
  ``tgi_request_count`` / ``tgi_request_success``. TGI exports no time-to-first-token histogram and no
  spec-decode counter.

Latency histograms are keyed by the ledger quantity they estimate: ``ttft`` (send -> first token),
``itl`` (the gap between consecutive tokens), ``tpot`` (one value per request: its mean time per output
token), ``e2e`` (whole request), ``queue`` (time queued).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpecCounterNames:
    """Counters of one engine's spec-decode ledger (vLLM's meaning): rounds, proposed tokens, accepted
    tokens and accepted tokens per position (label ``position``, 0-based)."""

    drafts: str
    draft_tokens: str
    accepted: str
    accepted_per_pos: str
    trim_trailing_zero_positions: bool = False  # the engine exports a fixed range of positions


def spec_counter_names(prefix: str, trim_trailing_zero_positions: bool = False) -> SpecCounterNames:
    """vLLM's spec-decode counter names under ``prefix`` (llama.cpp exports the same ledger under its own)."""
    return SpecCounterNames(
        drafts=f"{prefix}spec_decode_num_drafts",
        draft_tokens=f"{prefix}spec_decode_num_draft_tokens",
        accepted=f"{prefix}spec_decode_num_accepted_tokens",
        accepted_per_pos=f"{prefix}spec_decode_num_accepted_tokens_per_pos",
        trim_trailing_zero_positions=trim_trailing_zero_positions,
    )


def vllm_style_histograms(prefix: str, per_request: bool) -> dict[str, tuple[str, ...]]:
    """vLLM's latency histogram names under ``prefix`` (SGLang exports the same under its own), in the order
    they are reported; ``per_request``: also the per-request TPOT and queue-time histograms (vLLM only)."""
    names: dict[str, tuple[str, ...]] = {
        "ttft": (f"{prefix}time_to_first_token_seconds",),
        "itl": (f"{prefix}inter_token_latency_seconds", f"{prefix}time_per_output_token_seconds"),
    }
    if per_request:
        names["tpot"] = (f"{prefix}request_time_per_output_token_seconds",)
    names["e2e"] = (f"{prefix}e2e_request_latency_seconds",)
    if per_request:
        names["queue"] = (f"{prefix}request_queue_time_seconds",)
    return names


@dataclass(frozen=True)
class EngineNames:
    """One engine's metric names: the prefix that identifies it and what each name measures."""

    engine: str
    prefix: str
    spec: SpecCounterNames | None = None
    accept_length_gauge: str | None = None  # bonus token counted; 0 = speculation off
    accept_rate_gauge: str | None = None
    legacy_acceptance_rate_gauge: str | None = None  # vLLM v0
    legacy_emitted_counter: str | None = None  # vLLM v0: accepted + 1 per round
    legacy_draft_tokens: str | None = None
    legacy_accepted: str | None = None
    histograms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # quantity -> names, first found wins
    rates: tuple[tuple[str, str, str], ...] = ()  # (label, numerator counter, denominator counter)


VLLM = EngineNames(
    engine="vllm",
    prefix="vllm:",
    spec=spec_counter_names("vllm:"),
    legacy_acceptance_rate_gauge="vllm:spec_decode_draft_acceptance_rate",
    legacy_emitted_counter="vllm:spec_decode_num_emitted_tokens",
    legacy_draft_tokens="vllm:spec_decode_num_draft_tokens",
    legacy_accepted="vllm:spec_decode_num_accepted_tokens",
    histograms=vllm_style_histograms("vllm:", per_request=True),
)

SGLANG = EngineNames(
    engine="sglang",
    prefix="sglang:",
    accept_length_gauge="sglang:spec_accept_length",
    accept_rate_gauge="sglang:spec_accept_rate",
    histograms=vllm_style_histograms("sglang:", per_request=False),
)

LLAMACPP = EngineNames(
    engine="llama.cpp",
    prefix="llamacpp:",
    spec=spec_counter_names("llamacpp:", trim_trailing_zero_positions=True),
    rates=(
        ("generation speed per slot (tok/s)", "llamacpp:tokens_predicted", "llamacpp:tokens_predicted_seconds"),
        ("prompt speed per slot (tok/s)", "llamacpp:prompt_tokens", "llamacpp:prompt_seconds"),
    ),
)

TGI = EngineNames(
    engine="tgi",
    prefix="tgi_",
    histograms={
        "tpot": ("tgi_request_mean_time_per_token_duration",),
        "e2e": ("tgi_request_duration",),
        "queue": ("tgi_request_queue_duration",),
    },
)

ENGINES: tuple[EngineNames, ...] = (VLLM, SGLANG, LLAMACPP, TGI)

#: what each latency key estimates, for the tables of ``inspect`` and ``probe``
LATENCY_DEFINITIONS = {
    "ttft": "time to first token (s), one value per request",
    "itl": "gap between consecutive output tokens (s), one value per token",
    "tpot": "a request's mean time per output token (s), one value per request",
    "e2e": "end-to-end request latency (s), one value per request",
    "queue": "time a request waited in the queue (s)",
}


def engines_in(names: set[str]) -> list[EngineNames]:
    """The engines whose prefix starts any of ``names``, in :data:`ENGINES` order."""
    return [e for e in ENGINES if any(n.startswith(e.prefix) for n in names)]


__all__ = ["ENGINES", "LATENCY_DEFINITIONS", "LLAMACPP", "SGLANG", "TGI", "VLLM", "EngineNames",
           "SpecCounterNames", "engines_in", "spec_counter_names",
           "vllm_style_histograms"]
