"""The JSON objects serving engines send a probe, by the keys it reads (:mod:`specledger.probe.sse`,
:mod:`specledger.probe.counters`, :mod:`specledger.probe.metrics`) and the request body it sends
(:mod:`specledger.probe.loadgen`).

Every type here describes what a well-behaved engine sends; the readers still check each value's type at
run time (a server may send anything), and keep the object as it came, unknown keys included, so what is
written to a run folder is what the server said.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class StreamUsage(TypedDict, total=False):
    """OpenAI ``usage`` of a response (token counts); TGI's ``details.generated_tokens`` read as
    ``completion_tokens``."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LlamaTimings(TypedDict, total=False):
    """llama.cpp's per-response ``timings`` (``server_slot_stats::to_json``): a cumulative snapshot of the
    response so far; counts in tokens, times in milliseconds. ``draft_n`` / ``draft_n_accepted`` appear only
    once the slot has drafted."""

    cache_n: int  # prompt tokens taken from the KV cache
    prompt_n: int  # prompt tokens evaluated
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int  # tokens generated
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int  # draft tokens proposed
    draft_n_accepted: int  # draft tokens accepted


class VllmSpecDetails(TypedDict, total=False):
    """vLLM (>= 0.29, ``--per-request-spec-decode-metrics``): ``metrics.speculative_decoding`` of a response."""

    num_spec_steps: int  # draft (verify) rounds
    num_draft_tokens: int  # draft tokens proposed
    num_accepted_draft_tokens: int  # draft tokens accepted


class SglangSpecDetails(TypedDict, total=False):
    """SGLang's per-request figures: ``sglext.spec_tokens_details`` (>= 0.5.19) and the native ``meta_info``
    spellings of earlier releases (each triple: rounds, proposed, accepted)."""

    spec_verify_ct: int  # verify rounds
    spec_num_proposed_drafts: int
    spec_num_correct_drafts: int
    spec_proposed_drafts: int  # 0.5.11
    spec_accepted_drafts: int  # 0.5.11
    spec_draft_token_num: int  # 0.5.6 - 0.5.10
    spec_accept_token_num: int  # 0.5.6 - 0.5.10


class EngineSpecStats(TypedDict):
    """The per-request speculation object an engine attached to a response, tagged with its source
    (:func:`specledger.probe.sse.engine_spec_stats`); SGLang sends a list of details when n > 1."""

    source: Literal["vllm", "sglang"]
    details: VllmSpecDetails | SglangSpecDetails | list[SglangSpecDetails]


class ChatDelta(TypedDict, total=False):
    """``choices[0].delta`` of a chat stream chunk (``choices[0].message`` of a whole reply): the answer and,
    from reasoning parsers, the reasoning text (``reasoning_content``; vLLM >= 0.10 ``reasoning``)."""

    role: str
    content: str | None
    reasoning_content: str | None
    reasoning: str | None


class TgiToken(TypedDict, total=False):
    """One token of TGI's ``/generate_stream`` (``router/src/lib.rs``, ``Token``)."""

    id: int
    text: str
    logprob: float
    special: bool


class TgiDetails(TypedDict, total=False):
    """TGI's ``StreamDetails`` on the last event of a response."""

    finish_reason: str
    generated_tokens: int
    seed: int | None


class StreamChoice(TypedDict, total=False):
    """``choices[0]`` of a stream chunk: ``text`` (/v1/completions), ``delta`` (/v1/chat/completions) or
    ``message`` (a non-streamed reply)."""

    index: int
    text: str | None
    delta: ChatDelta | None
    message: ChatDelta | None
    finish_reason: str | None


class VllmResponseMetrics(TypedDict, total=False):
    """vLLM's ``metrics`` object on the final usage chunk (the part a probe reads)."""

    speculative_decoding: VllmSpecDetails


class SglangExtension(TypedDict, total=False):
    """SGLang's ``sglext`` object of a chunk (the part a probe reads)."""

    spec_tokens_details: SglangSpecDetails | list[SglangSpecDetails]


class StreamChunkJson(TypedDict, total=False):
    """One decoded ``data:`` object of an OpenAI-compatible (or TGI) stream, or a whole non-streamed reply."""

    id: str
    model: str
    system_fingerprint: str
    choices: list[StreamChoice]
    usage: StreamUsage | None
    timings: LlamaTimings | None
    metrics: VllmResponseMetrics
    sglext: SglangExtension
    token: TgiToken  # TGI /generate_stream
    details: TgiDetails | None  # TGI: on the last event
    error: str | dict[str, str]  # an in-stream error: a message or {"message": ...}


class StreamOptions(TypedDict):
    """``stream_options`` of a request: ask for the final ``usage`` chunk."""

    include_usage: bool


class RequestBody(TypedDict, total=False):
    """The JSON body of one streaming request (:func:`specledger.probe.loadgen.build_payload`), keys in the
    order sent; ``prompt`` for /v1/completions, ``messages`` for /v1/chat/completions."""

    model: str
    max_tokens: int
    temperature: float
    top_p: float
    stream: bool
    messages: list[dict[str, Any]]  # the workload's messages as given (role, content, ...)
    prompt: str
    seed: int
    stop: list[str]
    stream_options: StreamOptions


__all__ = ["ChatDelta", "EngineSpecStats", "LlamaTimings", "RequestBody", "SglangExtension", "SglangSpecDetails",
           "StreamChoice", "StreamChunkJson", "StreamOptions", "StreamUsage", "TgiDetails", "TgiToken",
           "VllmResponseMetrics", "VllmSpecDetails"]
