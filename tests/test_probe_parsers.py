"""Parsers of the probe: Prometheus text, SSE streams, vllm bench JSON (incl. fuzzing)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.ledger.acceptance import conditional_ratios
from specledger.probe.histograms import histogram_quantile, latency_histogram_summaries
from specledger.probe.prometheus import counter_total, parse_prometheus_text
from specledger.probe.spec_figures import SERVER_WIDE_WARNING, spec_decode_figures
from specledger.probe.sse import SSEEvent, SSEParser, interpret_event, parse_sse
from specledger.probe.vllm_bench import load_vllm_bench, parse_vllm_bench, parse_vllm_bench_text

# --- Prometheus ---------------------------------------------------------------------------


def vllm_scrape(
    drafts: float, draft_tokens: float, accepted: float, per_pos: list[float], total: bool
) -> str:
    """Counters split over two engines (values halved), with or without `_total`."""
    suffix = "_total" if total else ""
    lines = [
        "# HELP vllm:spec_decode_num_drafts Number of drafts.",
        "# TYPE vllm:spec_decode_num_drafts counter",
    ]
    for engine in ("0", "1"):
        labels = f'model_name="m",engine="{engine}"'
        lines.append(f"vllm:spec_decode_num_drafts{suffix}{{{labels}}} {drafts / 2}")
        lines.append(f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9")
        lines.append(f"vllm:spec_decode_num_draft_tokens{suffix}{{{labels}}} {draft_tokens / 2}")
        lines.append(f"vllm:spec_decode_num_accepted_tokens{suffix}{{{labels}}} {accepted / 2}")
        for position, value in enumerate(per_pos):
            lines.append(
                f'vllm:spec_decode_num_accepted_tokens_per_pos{suffix}{{{labels},position="{position}"}} {value / 2}'
            )
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("total", [True, False])
def test_vllm_counter_delta_math(total: bool) -> None:
    before = parse_prometheus_text(vllm_scrape(10, 30, 12, [6, 4, 2], total))
    # window: 100 drafts of gamma 3; Pr(K>=1)=.8, Pr(K>=2)=.5, Pr(K>=3)=.2 -> accepted 150
    after = parse_prometheus_text(vllm_scrape(110, 330, 162, [86, 54, 22], total))
    assert counter_total(after, "vllm:spec_decode_num_drafts") == 110
    fig = spec_decode_figures(before, after)
    assert fig.source == "vllm"
    assert fig.num_drafts == 100 and fig.num_draft_tokens == 300 and fig.num_accepted_tokens == 150
    assert fig.mean_acceptance_length == pytest.approx(2.5)
    assert fig.mean_accepted_per_draft == pytest.approx(1.5)
    assert fig.draft_acceptance_rate == pytest.approx(0.5)
    assert fig.per_position_rates == pytest.approx([0.8, 0.5, 0.2])
    assert fig.conditional_rates == pytest.approx([0.8, 0.625, 0.4])
    assert SERVER_WIDE_WARNING in fig.warnings
    # invariant: E[L] = 1 + sum_i Pr(K >= i)
    assert fig.mean_acceptance_length == pytest.approx(1 + sum(fig.per_position_rates))


def test_counter_reset_is_a_warning_not_figures() -> None:
    before = parse_prometheus_text(vllm_scrape(100, 300, 150, [80, 50, 20], True))
    after = parse_prometheus_text(vllm_scrape(10, 30, 15, [8, 5, 2], True))
    fig = spec_decode_figures(before, after)
    assert fig.mean_acceptance_length is None
    assert any("backwards" in w for w in fig.warnings)


def test_conditional_rates_handle_zero() -> None:
    assert conditional_ratios([0.5, 0.0, 0.0]) == [0.5, 0.0, None]


def test_sglang_gauges_reported_as_after_value_with_caveat() -> None:
    before = parse_prometheus_text("sglang:spec_accept_length 9.0\n")
    text = (
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="q",tp_rank="0"} 3.0\n'
        'sglang:spec_accept_length{model_name="q",tp_rank="1"} 2.0\n'
        'sglang:spec_accept_rate{model_name="q"} 0.61\n'
    )
    fig = spec_decode_figures(before, parse_prometheus_text(text))
    assert fig.source == "sglang"
    assert fig.sglang_accept_length == pytest.approx(2.5)
    assert fig.sglang_accept_rate == pytest.approx(0.61)
    assert fig.mean_acceptance_length is None
    assert any("bonus token" in w and "gauges" in w for w in fig.warnings)
    assert SERVER_WIDE_WARNING in fig.warnings


def test_no_spec_metrics() -> None:
    snap = parse_prometheus_text("process_cpu_seconds_total 3\n")
    fig = spec_decode_figures(snap, snap)
    assert fig.source is None and any("no spec-decode" in w for w in fig.warnings)


def test_malformed_prometheus_names_the_line() -> None:
    text = "good_metric 1\nbad_metric{a=1} 2\n"
    with pytest.raises(SpecLedgerError, match="line 2"):
        parse_prometheus_text(text)


def test_histogram_quantiles_from_bucket_deltas() -> None:
    def hist(counts: list[int], total: float) -> str:
        bounds = ["0.01", "0.1", "1.0", "+Inf"]
        lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{b}"}} {c}' for b, c in zip(bounds, counts)]
        lines += [
            f"vllm:time_to_first_token_seconds_sum {total}",
            f"vllm:time_to_first_token_seconds_count {counts[-1]}",
        ]
        lines += [
            f'vllm:time_per_output_token_seconds_bucket{{le="{b}"}} {c}' for b, c in zip(bounds, counts)
        ]
        return "\n".join(lines) + "\n"

    before = parse_prometheus_text(hist([5, 5, 5, 5], 0.02))
    after = parse_prometheus_text(hist([5, 55, 105, 105], 30.02))  # window: 50 in (.01,.1], 50 in (.1,1]
    out = latency_histogram_summaries(before, after)
    assert out["ttft"]["count"] == 100 and out["ttft"]["mean_s"] == pytest.approx(0.3)
    assert out["ttft"]["p50_s"] == pytest.approx(0.1)
    assert out["ttft"]["p99_s"] == pytest.approx(0.1 + 0.9 * 49 / 50)
    assert out["itl"]["metric"] == "vllm:time_per_output_token_seconds"
    assert histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None
    assert histogram_quantile(0.99, [(1.0, 1), (math.inf, 10)]) == 1.0


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_prometheus_fuzz_text(text: str) -> None:
    try:
        snap = parse_prometheus_text(text)
        spec_decode_figures(snap, snap)
        latency_histogram_summaries(snap, snap)
    except SpecLedgerError:
        pass


metric_line = st.builds(
    lambda name, pos, value, total: f'{name}{"_total" if total else ""}{{position="{pos}"}} {value}',
    st.sampled_from(["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens_per_pos", "x"]),
    st.one_of(st.integers(-2, 5).map(str), st.text(alphabet="ab1", max_size=3)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(metric_line, max_size=6), st.lists(metric_line, max_size=6))
def test_prometheus_fuzz_structured(before_lines: list[str], after_lines: list[str]) -> None:
    try:
        before = parse_prometheus_text("\n".join(before_lines) + "\n")
        after = parse_prometheus_text("\n".join(after_lines) + "\n")
        spec_decode_figures(before, after)
    except SpecLedgerError:
        pass


# --- SSE ----------------------------------------------------------------------------------

STREAM = (
    b": ping\r\n\r\n"
    b'data: {"choices":[{"text":"Hel"}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"lo \xc3\xa9t\xc3\xa9"}}]}\r\n\r\n'
    b"event: custom\rdata: line1\rdata:line2\r\r"
    b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\n'
    b"data: [DONE]\n\n"
)


def test_sse_parses_events_and_openai_chunks() -> None:
    events = parse_sse(STREAM)
    assert [e.data for e in events] == [
        '{"choices":[{"text":"Hel"}]}',
        '{"choices":[{"delta":{"content":"lo été"}}]}',
        "line1\nline2",
        '{"choices":[],"usage":{"completion_tokens":7}}',
        "[DONE]",
    ]
    assert events[2].event == "custom"
    chunks = [interpret_event(e) for e in events]
    assert [c.kind for c in chunks] == ["delta", "delta", "error", "usage", "done"]
    assert chunks[0].text + chunks[1].text == "Hello été"
    assert chunks[3].usage == {"completion_tokens": 7}
    assert "malformed JSON" in (chunks[2].error or "")


def test_sse_every_split_position_gives_the_same_events() -> None:
    whole = parse_sse(STREAM)
    for cut in range(len(STREAM) + 1):
        parser = SSEParser()
        events = parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) + parser.close()
        assert events == whole, cut
    parser = SSEParser()
    byte_by_byte = [e for i in range(len(STREAM)) for e in parser.feed(STREAM[i : i + 1])] + parser.close()
    assert byte_by_byte == whole


def test_sse_unterminated_last_event_is_flushed_on_close() -> None:
    assert parse_sse(b"data: [DONE]") == [SSEEvent(data="[DONE]")]


def test_interpret_event_errors_are_objects() -> None:
    assert interpret_event(SSEEvent(data="[1,2]")).kind == "error"
    assert interpret_event(SSEEvent(data='{"choices":[{"text":5}]}')).kind == "error"
    err = interpret_event(SSEEvent(data='{"error":{"message":"overloaded"}}'))
    assert err.kind == "error" and "overloaded" in (err.error or "")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_sse_fuzz_random_bytes_and_splits(data: bytes, cuts: list[int]) -> None:
    whole = parse_sse(data)
    points = sorted({min(c, len(data)) for c in cuts})
    parser = SSEParser()
    events, last = [], 0
    for p in [*points, len(data)]:
        events += parser.feed(data[last:p])
        last = p
    events += parser.close()
    assert events == whole
    for event in events:
        interpret_event(event)  # never raises


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries({"choices": st.lists(json_values, max_size=2), "usage": json_values}),
        st.fixed_dictionaries(
            {"choices": st.fixed_dictionaries({"delta": json_values, "text": json_values}).map(lambda c: [c])}
        ),
    )
)
def test_interpret_event_fuzz_json(obj: object) -> None:
    chunk = interpret_event(SSEEvent(data=json.dumps(obj)))
    assert chunk.kind in ("delta", "usage", "done", "error")
    assert isinstance(chunk.text, str)


# --- vllm bench JSON ------------------------------------------------------------------------


def bench_sample() -> dict:
    """A realistic `vllm bench serve --save-result` file (keys as in vllm/benchmarks/serve.py)."""
    return {
        "date": "20250101-120000",
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": 200,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 16,
        "duration": 41.7,
        "completed": 200,
        "failed": 0,
        "total_input_tokens": 51200,
        "total_output_tokens": 25600,
        "request_throughput": 4.796,
        "request_goodput": None,
        "output_throughput": 613.9,
        "total_token_throughput": 1841.7,
        "max_output_tokens_per_s": 800.0,
        "max_concurrent_requests": 16,
        "mean_ttft_ms": 85.2,
        "median_ttft_ms": 80.1,
        "std_ttft_ms": 12.0,
        "p99_ttft_ms": 140.3,
        "mean_tpot_ms": 24.9,
        "median_tpot_ms": 24.5,
        "std_tpot_ms": 2.0,
        "p99_tpot_ms": 31.0,
        "mean_itl_ms": 55.0,
        "median_itl_ms": 52.0,
        "std_itl_ms": 9.0,
        "p99_itl_ms": 90.0,
        "p95_itl_ms": 75.0,
        "p99.9_itl_ms": 120.0,
        "mean_e2el_ms": 3300.0,
        "median_e2el_ms": 3280.0,
        "std_e2el_ms": 100.0,
        "p99_e2el_ms": 3600.0,
        "spec_decode_acceptance_rate": 55.0,
        "spec_decode_acceptance_length": 2.65,
        "spec_decode_num_drafts": 9000,
        "spec_decode_draft_tokens": 27000,
        "spec_decode_accepted_tokens": 14850,
        "spec_decode_per_position_acceptance_rates": [0.8, 0.55, 0.3],
        "input_lens": [256, 256],
        "output_lens": [128, 128],
        "ttfts": [0.08, 0.09],
        "itls": [[0.05, 0.06], [0.05]],
        "errors": ["", ""],
        "custom_field": {"kept": True},
    }


def test_vllm_bench_import(tmp_path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(bench_sample()))
    result = load_vllm_bench(path)
    assert result.completed == 200 and result.request_rate == "inf"
    assert result.model_extra == {
        "endpoint_type": "openai-chat",
        "custom_field": {"kept": True},
        "p95_itl_ms": 75.0,
        "p99.9_itl_ms": 120.0,
    }
    assert result.percentiles("itl") == {95.0: 75.0, 99.0: 90.0, 99.9: 120.0}
    summary = result.summary()
    assert summary["tpot_ms"]["p50"] == 24.5 and summary["chunk_itl_ms"]["p95"] == 75.0
    spec = summary["spec_decode"]
    assert spec["draft_acceptance_rate"] == pytest.approx(0.55)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 14850 / 9000)
    assert spec["conditional_rates"] == pytest.approx([0.8, 0.55 / 0.8, 0.3 / 0.55])
    assert SERVER_WIDE_WARNING in spec["warnings"]


def test_vllm_bench_minimal_and_integral_floats() -> None:
    result = parse_vllm_bench({"completed": 3.0, "mean_ttft_ms": 5})
    assert result.completed == 3 and result.mean_ttft_ms == 5.0
    assert result.summary()["spec_decode"] is None


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"mean_ttft_ms": "fast"}, "mean_ttft_ms"),
        ({"completed": True}, "completed"),
        ({"completed": 2.5}, "completed"),
        ({"p95_itl_ms": [1]}, "p95_itl_ms"),
        (
            {"spec_decode_per_position_acceptance_rates": [0.5, "x"]},
            "spec_decode_per_position_acceptance_rates.1",
        ),
    ],
)
def test_vllm_bench_wrong_types_name_the_field(patch: dict, field: str) -> None:
    with pytest.raises(SpecLedgerError, match=f"field '{field}'"):
        parse_vllm_bench({**bench_sample(), **patch})


def test_vllm_bench_not_json(tmp_path) -> None:
    with pytest.raises(SpecLedgerError, match="not JSON"):
        parse_vllm_bench_text("{nope")
    with pytest.raises(SpecLedgerError, match="JSON object"):
        parse_vllm_bench_text("[1, 2]")
    with pytest.raises(SpecLedgerError, match="cannot read"):
        load_vllm_bench(tmp_path / "missing.json")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(bench_sample())), json_values, max_size=6))
def test_vllm_bench_fuzz(obj: dict) -> None:
    try:
        parse_vllm_bench(obj).summary()
    except SpecLedgerError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=100))
def test_vllm_bench_fuzz_text(text: str) -> None:
    try:
        parse_vllm_bench_text(text)
    except SpecLedgerError:
        pass


# --- every reader of issue 21, fuzzed: a SpecLedgerError (one line) or a result, never a traceback ---------

from specledger.probe.guidellm import parse_guidellm  # noqa: E402
from specledger.probe.histograms import counter_rates  # noqa: E402
from specledger.probe.inspect_file import READERS, sniff  # noqa: E402
from specledger.probe.prometheus import EMPTY_SNAPSHOT  # noqa: E402
from specledger.probe.vllm_bench import parse_vllm_bench_records  # noqa: E402


def one_line_error(call) -> None:
    try:
        call()
    except SpecLedgerError as exc:
        assert "\n" not in str(exc) and str(exc)


engine_line = st.builds(
    lambda name, pos, value: f'{name}{{position="{pos}",dp_rank="0"}} {value}',
    st.sampled_from([
        "llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
        "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "sglang:spec_accept_length",
        "sglang:spec_accept_rate", "vllm:spec_decode_num_emitted_tokens_total", "tgi_request_duration_bucket",
        "sglang:time_to_first_token_seconds_bucket", "vllm:spec_decode_num_accepted_tokens_total",
    ]),
    st.one_of(st.integers(-1, 70).map(str), st.text(alphabet="a1+Inf", max_size=3)),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(engine_line, max_size=8), st.lists(engine_line, max_size=8))
def test_engine_readers_fuzz(before_lines: list[str], after_lines: list[str]) -> None:
    def read() -> None:
        before = parse_prometheus_text("\n".join(before_lines) + "\n")
        after = parse_prometheus_text("\n".join(after_lines) + "\n")
        spec_decode_figures(before, after)
        latency_histogram_summaries(before, after)
        counter_rates(EMPTY_SNAPSHOT, after)

    one_line_error(read)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries({"benchmarks": st.lists(json_values, max_size=3), "metadata": json_values}),
        st.fixed_dictionaries({"benchmarks": st.lists(st.fixed_dictionaries({
            "metrics": st.dictionaries(st.sampled_from(["request_totals", "time_to_first_token_ms",
                                                        "inter_token_latency_ms", "output_tokens_per_iteration"]),
                                       json_values, max_size=3),
            "requests": json_values, "config": json_values, "duration": json_values}), min_size=1, max_size=2)}),
    )
)
def test_guidellm_fuzz(obj: object) -> None:
    one_line_error(lambda: parse_guidellm(obj))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from(sorted(bench_sample()) + ["request_goodput:"]),
                                          json_values, max_size=4).map(json.dumps), st.text(max_size=20)),
                max_size=4))
def test_vllm_bench_json_lines_fuzz(lines: list[str]) -> None:
    one_line_error(lambda: parse_vllm_bench_records("\n".join(lines)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(json_values.map(json.dumps), st.just("[DONE]")), max_size=4).map(
        lambda items: "".join(f"data: {i}\n\n" for i in items)),
    st.fixed_dictionaries({"choices": st.just([{"delta": {"reasoning_content": "x"}}]), "timings": json_values,
                           "token": json_values}).map(lambda o: f"data: {json.dumps(o)}\n\n"),
))
def test_inspect_readers_fuzz(text: str) -> None:
    def read() -> None:
        if text.strip():
            READERS[sniff(text)](text)

    one_line_error(read)
