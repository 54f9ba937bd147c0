"""vLLM-compatible Prometheus metrics for the serve engine (one CollectorRegistry per app).

Speculative-decoding counters, with vLLM's names and semantics (every one labelled
``model_name``; prometheus_client appends ``_total`` on exposition, as vLLM's do):

* ``vllm:spec_decode_num_drafts``       += 1 per round that proposed >= 1 candidate;
* ``vllm:spec_decode_num_draft_tokens`` += proposed (candidates the target verified);
* ``vllm:spec_decode_num_accepted_tokens`` += K, the accepted prefix (bonus token excluded);
* ``vllm:spec_decode_num_accepted_tokens_per_pos{position=i}`` += 1 when K >= i + 1
  (0-based), so per_pos[i] / drafts = Pr(K >= i + 1).

Truncated rounds (a stop string, EOS or max_tokens cut the committed span) are counted as
vLLM counts them: with the K the verifier accepted, even if the stop later drops some of
those tokens from the output. Rounds with no candidates (plain steps, or a model-free drafter
with no match) are not drafts. A round counts when it completes, so a request cancelled
mid-way contributes the rounds it ran.

Latency histograms (seconds, measured on the server with ``time.perf_counter`` from the
request's arrival, i.e. queueing included, as vLLM does):
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (one observation
per gap between consecutive emitted chunks of a request), ``vllm:e2e_request_latency_seconds``,
``vllm:request_queue_time_seconds``. Counters ``vllm:prompt_tokens``, ``vllm:generation_tokens``
(tokens actually emitted), ``vllm:request_success{finished_reason=stop|length}``,
``specledger:request_failures`` (requests answered 500 because the engine failed on them); gauges
``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` read live from the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specledger.records import RoundRecord

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True, slots=True)
class DraftCounts:
    """One round's contribution to the spec-decode counters (all zero for a non-draft round)."""

    drafts: int
    draft_tokens: int
    accepted: int
    positions: range  # positions whose per-position counter gains 1: 0 .. K-1


def draft_counts(rnd: RoundRecord) -> DraftCounts:
    """vLLM semantics: a draft is a round with proposed >= 1; accepted = K (no bonus token)."""
    if rnd.proposed <= 0:
        return DraftCounts(0, 0, 0, range(0))
    return DraftCounts(1, rnd.proposed, rnd.accepted, range(rnd.accepted))


class ServeMetrics:
    """The app's registry and the instruments the worker updates (thread-safe: prometheus_client)."""

    def __init__(
        self,
        model_name: str,
        max_positions: int,
        running: Callable[[], float],
        waiting: Callable[[], float],
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        reg = self.registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=reg)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Draft rounds (rounds with >= 1 candidate).")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Candidate tokens verified.")
        self.num_accepted = counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted candidate tokens (K; bonus token excluded)."
        )
        self.accepted_per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Drafts whose first position+1 candidates were accepted.", ("position",),
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("vllm:generation_tokens", "Emitted output tokens.")
        self.request_success = counter("vllm:request_success", "Finished requests.", ("finished_reason",))
        self.request_failures = counter("specledger:request_failures", "Requests the engine failed on (500).")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between emitted chunks.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to decode start.", E2E_BUCKETS)

        running_gauge = Gauge("vllm:num_requests_running", "Requests decoding now.", labels, registry=reg)
        waiting_gauge = Gauge("vllm:num_requests_waiting", "Requests queued.", labels, registry=reg)
        running_gauge.labels(model_name).set_function(running)
        waiting_gauge.labels(model_name).set_function(waiting)

        # expose zeros from the start, as vLLM does
        for c in (self.num_drafts, self.num_draft_tokens, self.num_accepted, self.prompt_tokens,
                  self.generation_tokens, self.request_failures):
            c.labels(model_name)
        for p in range(max_positions):
            self.accepted_per_pos.labels(model_name, str(p))
        for reason in ("stop", "length"):
            self.request_success.labels(model_name, reason)

    def observe_round(self, rnd: RoundRecord) -> None:
        counts = draft_counts(rnd)
        if not counts.drafts:
            return
        m = self.model_name
        self.num_drafts.labels(m).inc(counts.drafts)
        self.num_draft_tokens.labels(m).inc(counts.draft_tokens)
        self.num_accepted.labels(m).inc(counts.accepted)
        for p in counts.positions:
            self.accepted_per_pos.labels(m, str(p)).inc()

    def observe_start(self, prompt_tokens: int, queue_time: float) -> None:
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)
        self.queue_time.labels(self.model_name).observe(queue_time)

    def observe_chunk(self, n_tokens: int, since_arrival: float, since_previous: float | None) -> None:
        """A chunk left the engine: TTFT for the first (``since_previous`` None), else one ITL gap."""
        self.generation_tokens.labels(self.model_name).inc(n_tokens)
        if since_previous is None:
            self.ttft.labels(self.model_name).observe(since_arrival)
        else:
            self.itl.labels(self.model_name).observe(since_previous)

    def observe_finish(self, finish_reason: str, since_arrival: float) -> None:
        self.request_success.labels(self.model_name, finish_reason).inc()
        self.e2e.labels(self.model_name).observe(since_arrival)

    def observe_failure(self) -> None:
        self.request_failures.labels(self.model_name).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
