"""Every engine fixture of tests/data/engines, read by the project's own readers, against figures computed by hand
from the fixture (issue 44: "23/23 of your own real-engine fixtures"). One row per file, the README there says
which format (engine, version, source file) each follows; a file missing from the table or the README fails.

The readers are the ones ``inspect``, ``import`` and a live ``probe`` use: :func:`specledger.probe.inspect_file.
inspect_file` (a ``/metrics`` dump through :mod:`~specledger.probe.spec_figures`, :mod:`~specledger.probe.histograms`
and :func:`~specledger.probe.inspect_file.engine_scalars`; an SSE capture or a non-streamed reply through
:mod:`~specledger.probe.sse` and :mod:`~specledger.probe.metrics`; a ``vllm bench serve`` result through
:mod:`~specledger.probe.vllm_bench`; a guidellm report through :mod:`~specledger.probe.guidellm`), the live probe's
stream decoder (:class:`~specledger.probe.sse.OpenAIStreamDecoder`: the text and the reasoning text it keeps), and,
for a scrape taken after requests, the window between two scrapes with the per-request figures reconciled
(:func:`~specledger.probe.counters.engine_counters`).

Where an engine did not measure something the reader must say so (None, "not measured", a warning), never a
figure: an SGLang server with speculation off exports an acceptance length of 0, a vLLM server without
speculation no spec-decode family at all, guidellm 0.3 no streaming iterations."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.probe.counters import engine_counters
from specledger.probe.inspect_file import counter_rows, inspect_file, split_responses
from specledger.probe.prometheus import EMPTY_SNAPSHOT, parse_prometheus_text
from specledger.probe.spec_figures import spec_decode_figures
from specledger.probe.sse import OpenAIStreamDecoder, SSEEvent, interpret_event, parse_sse
from specledger.probe.tables import spec_rows

DATA = Path(__file__).parent / "data" / "engines"
Reader = Callable[[str], dict[str, Any]]


# ------------------------------------------------------------------------------------------- matchers
class Has:
    """Matches a string holding every one of ``parts``, or a list with an item that does."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __eq__(self, other: object) -> bool:
        items = other if isinstance(other, list) else [other]
        return any(isinstance(x, str) and all(p in x for p in self.parts) for x in items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.parts!r}"


class Lacks(Has):
    """Matches a string or list in which no item holds ``parts``."""

    def __eq__(self, other: object) -> bool:
        return not super().__eq__(other)


ABSENT = object()  # the key is not there at all


def pick(found: Any, path: str) -> Any:
    """``found`` at a dotted ``path`` ("records.2.spec_decode.warnings"; list items by index); ABSENT if not there."""
    for part in path.split("."):
        if isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            return ABSENT
    return found


def expected(value: Any) -> Any:
    """Floats (also inside lists) compare to 1e-9, the rest as they are."""
    if isinstance(value, float) and math.isfinite(value):
        return pytest.approx(value, rel=1e-9)
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return pytest.approx(value, rel=1e-9)
    return value


# ---------------------------------------------------------------------------------------------- readers
def decoded(name: str) -> dict[str, Any]:
    """The text and reasoning text the live probe keeps: an SSE body through its stream decoder, a
    non-streamed reply as the one object it is."""
    raw = (DATA / name).read_bytes()
    if name.endswith(".sse"):
        decoder = OpenAIStreamDecoder()
        chunks = decoder.feed(raw) + decoder.close()
    else:
        chunks = [interpret_event(SSEEvent(data=raw.decode("utf-8")))]
    return {"text": "".join(c.text for c in chunks), "reasoning": "".join(c.reasoning for c in chunks)}


def inspect(name: str) -> dict[str, Any]:
    """What ``specledger inspect`` reads from the file, with the rows its table prints for a dump and the text a
    live probe keeps for a stream or a reply."""
    found = inspect_file(DATA / name)
    if found["format"] == "prometheus":
        found["rows"] = dict(counter_rows(found))
        found["spec_rows"] = dict(spec_rows(found["spec_decode"]))
    if found["format"] in ("sse", "completion"):
        found.update(decoded(name))
    return found


def per_request(stream: str) -> list[dict[str, Any]]:
    """What the probe keeps per request of a capture: each response's last ``timings`` and per-request figures."""
    out = []
    for response in split_responses([interpret_event(e) for e in parse_sse((DATA / stream).read_text())]):
        timings = [c.timings for c in response if c.timings is not None]
        specs = [c.spec_stats for c in response if c.spec_stats]
        out.append({**({"server_timings": timings[-1]} if timings else {}),
                    **({"server_spec": specs[-1]} if specs else {})})
    return out


def window(before: str | None, stream: str) -> Reader:
    """A scrape taken after the requests of ``stream``: the dump as :func:`inspect` reads it, the window's
    figures from ``before`` (None: the server's start) and the per-request sums reconciled with the counters."""

    def read(name: str) -> dict[str, Any]:
        after_text = (DATA / name).read_text()
        before_text = (DATA / before).read_text() if before else None
        start = parse_prometheus_text(before_text) if before_text else EMPTY_SNAPSHOT
        return {**inspect(name),
                "window": spec_decode_figures(start, parse_prometheus_text(after_text)).to_dict(),
                "reconciled": engine_counters(per_request(stream), before_text, after_text)}

    return read


class Case(NamedTuple):
    """One fixture: the file, the reader, and figure path -> the value computed by hand from the file."""

    file: str
    expect: dict[str, Any]
    read: Reader = inspect


NOT_MEASURED = None
CASES = [
    # --- llama.cpp ------------------------------------------------------------------------------------
    Case("llamacpp_metrics.prom", {
        "format": "prometheus", "engine": "llama.cpp", "unread": [],
        "spec_decode.source": "llama.cpp",
        "spec_decode.num_drafts": 200.0, "spec_decode.num_draft_tokens": 800.0,
        "spec_decode.num_accepted_tokens": 300.0,
        "spec_decode.mean_acceptance_length": 2.5,  # 1 + 300/200
        "spec_decode.draft_acceptance_rate": 0.375,  # 300/800
        # positions 0..3 of 0..63 (the trailing zeros trimmed, so γ reads 4): 140, 90, 50, 20 over 200 drafts
        "spec_decode.per_position_rates": [0.7, 0.45, 0.25, 0.1],
        "spec_decode.warnings": Lacks("inconsistent"),
        "rates.generation speed per slot (tok/s).value": 100.0,  # 1380 tokens / 13.8 s
        "rates.prompt speed per slot (tok/s).value": 2000.0,  # 5120 / 2.56 s
        "counters.llamacpp:n_decode.value": 420, "counters.llamacpp:kv_cache_usage_ratio.value": 0.12,
    }),
    Case("llamacpp_reasoning_stream.sse", {
        "format": "sse", "engine": "llama.cpp", "version": "b6100-abc1234",
        "reasoning": "Let me think about 2+2.", "text": "4",  # the reasoning text kept, not dropped
        "stream.token_chunks": 3, "stream.completion_tokens": 9,
        "stream.mean_tokens_per_chunk": 3.0,  # 9 tokens over 2 reasoning chunks and 1 answer chunk
        "stream.reasoning_chars": 23, "stream.timings_draft_n": 12, "stream.timings_draft_n_accepted": 7,
        "spec_decode.draft_acceptance_rate": 7 / 12, "spec_decode.responses": 1,
        "unread": Has("no arrival times"),
    }),
    Case("llamacpp_chat_completion.json", {
        "format": "completion", "engine": "llama.cpp", "version": "b6100-abc1234",
        "reasoning": "Two and two make four; the user wants only the number.", "text": "4",
        "stream.completion_tokens": 14, "stream.mean_tokens_per_chunk": NOT_MEASURED,  # one object, no chunks
        "stream.timings_predicted_n": 14, "stream.timings_predicted_ms": 98.0,
        "spec_decode.num_draft_tokens": 16.0, "spec_decode.num_accepted_tokens": 9.0,
        "spec_decode.draft_acceptance_rate": 9 / 16,
        "unread": Has("non-streamed reply has no chunks"),
    }),
    Case("llamacpp_live_spec_stream.sse", {  # real capture: two responses, timings cumulative per response
        "engine": "llama.cpp", "version": "b1-0c1e570", "stream.responses": 2, "spec_decode.responses": 2,
        "spec_decode.num_draft_tokens": 120.0, "spec_decode.num_accepted_tokens": 32.0,  # last snapshots 60 + 60
        "spec_decode.draft_acceptance_rate": 32 / 120,
        "stream.timings_predicted_n": 82,  # 41 + 41, not a sum over 40 snapshots
        "stream.completion_tokens": 82, "stream.token_chunks": 80,
    }),
    Case("llamacpp_live_metrics_before.prom", {  # real capture: nothing drafted yet
        "engine": "llama.cpp", "spec_decode.num_drafts": 0.0,
        "spec_decode.mean_acceptance_length": NOT_MEASURED, "spec_decode.draft_acceptance_rate": NOT_MEASURED,
        "spec_decode.warnings": Has("no draft rounds"),
        "counters.llamacpp:tokens_predicted.value": 82,
    }),
    Case("llamacpp_live_metrics_after.prom", {  # real capture after the two responses of the spec stream
        "counters.llamacpp:tokens_predicted.value": 164, "counters.llamacpp:tokens_predicted.type": "counter",
        "counters.llamacpp:tokens_predicted_seconds.value": 2.45646, "counters.llamacpp:prompt_tokens.value": 170,
        "counters.llamacpp:prompt_tokens_cached.value": 73, "counters.llamacpp:n_busy_slots_per_decode.type": "gauge",
        "counters.llamacpp:spec_decode_num_accepted_tokens_per_pos": ABSENT,  # read as rates instead
        "rows.llamacpp:tokens_predicted (counter)": "164: Number of generation tokens processed",
        "unread": Lacks("not mapped"),
        "window.num_drafts": 4.0, "window.num_draft_tokens": 120.0, "window.num_accepted_tokens": 32.0,
        "window.mean_acceptance_length": 9.0,  # 1 + 32/4
        "window.draft_acceptance_rate": 32 / 120,
        "reconciled.server": {"drafts": 4, "draft_tokens": 120, "accepted": 32},
        "reconciled.per_request_sum": {"drafts": None, "draft_tokens": 120, "accepted": 32},
        "reconciled.agree": True, "reconciled.compared": ["draft_tokens", "accepted"],
        "reconciled.sources": {"per_request": ["llama.cpp timings"], "server": "llama.cpp"},
        "reconciled.verdict": Has("per-request sums agree", "drafts not comparable"),
    }, window("llamacpp_live_metrics_before.prom", "llamacpp_live_spec_stream.sse")),
    Case("llamacpp_live_off_stream.sse", {  # real capture, no speculation: timings without draft fields
        "engine": "llama.cpp", "spec_decode": NOT_MEASURED,
        "stream.timings_predicted_n": 32, "stream.timings_predicted_ms": 386.514,
        "stream.timings_prompt_ms": 189.854, "stream.timings_draft_n": ABSENT,
    }),
    Case("llamacpp_live_metrics_off.prom", {  # real capture of that server: its spec counters all 0
        "spec_decode.mean_acceptance_length": NOT_MEASURED, "spec_decode.warnings": Has("no draft rounds"),
        "reconciled.server": {"drafts": 0, "draft_tokens": 0, "accepted": 0},
        "reconciled.per_request_sum.draft_tokens": 0, "reconciled.agree": True,
    }, window(None, "llamacpp_live_off_stream.sse")),
    # --- SGLang -------------------------------------------------------------------------------------------
    Case("sglang_metrics_off.prom", {  # speculation off: spec_accept_length 0 is "off", never a length of 0
        "engine": "sglang", "spec_decode.source": "sglang", "spec_decode.off": True,
        "spec_decode.sglang_accept_length": NOT_MEASURED, "spec_decode.sglang_accept_rate": NOT_MEASURED,
        "spec_decode.mean_acceptance_length": NOT_MEASURED, "spec_decode.warnings": Has("bonus token"),
        "spec_rows.spec decode": "off (the server's gauges say so)",
        "counters.sglang:spec_accept_length.value": NOT_MEASURED,
        "counters.sglang:spec_accept_rate.value": NOT_MEASURED,
        "counters.sglang:spec_accept_length.note": Has("off"),
        "rows.sglang:spec_accept_length (gauge)": Has("not measured"),
        "latency.ttft.metric": "sglang:time_to_first_token_seconds", "latency.ttft.count": 100.0,
        "latency.itl.metric": "sglang:inter_token_latency_seconds", "latency.itl.mean_s": 0.021,
        "latency.e2e.mean_s": 2.0,
    }),
    Case("sglang_plain_stream.sse", {  # speculation off: no sglext, so no per-request figures
        "format": "sse", "text": "The answer is 42.", "reasoning": "", "per_request_spec": NOT_MEASURED,
        "spec_decode": NOT_MEASURED, "stream.completion_tokens": 5, "stream.token_chunks": 5,
        "stream.mean_tokens_per_chunk": 1.0, "stream.models": ["qwen3-8b"],
    }),
    Case("sglang_spec_details_stream.sse", {
        "engine": "sglang", "stream.responses": 2,
        # response 1: 5 verify steps, 15 proposed, 7 correct; response 2: 3, 9, 2
        "per_request_spec": {"source": "SGLang sglext.spec_tokens_details", "responses": 2, "drafts": 8,
                             "draft_tokens": 24, "accepted": 9},
        "text": "Paris is the capital of France.Yes.", "stream.completion_tokens": 17,
    }),
    Case("sglang_spec_metrics_before.prom", {
        "spec_decode.sglang_accept_length": 2.1, "spec_decode.sglang_accept_rate": 0.37,
        "counters.sglang:spec_verify_calls.value": 40,
    }),
    Case("sglang_spec_metrics_after.prom", {
        "spec_decode.sglang_accept_length": 2.0, "spec_decode.sglang_accept_rate": 0.375,
        "reconciled.server": {"drafts": 8, "draft_tokens": None, "accepted": None},  # 48 - 40 verify calls
        "reconciled.compared": ["drafts"], "reconciled.agree": True,
    }, window("sglang_spec_metrics_before.prom", "sglang_spec_details_stream.sse")),
    # --- vLLM -----------------------------------------------------------------------------------------
    Case("vllm_v1_metrics.prom", {  # two data-parallel engines, summed over their label sets
        "engine": "vllm", "unread": [], "spec_decode.source": "vllm",
        "spec_decode.num_drafts": 500.0, "spec_decode.num_draft_tokens": 1500.0,
        "spec_decode.num_accepted_tokens": 850.0,  # 720 + 130
        "spec_decode.mean_acceptance_length": 2.7,  # 1 + 850/500
        "spec_decode.draft_acceptance_rate": 850 / 1500,
        "spec_decode.per_position_rates": [0.78, 0.56, 0.36],  # (320+70, 240+40, 160+20) / 500
        "spec_decode.conditional_rates": [0.78, 0.56 / 0.78, 0.36 / 0.56],
        "spec_decode.warnings": Lacks("inconsistent"),
        "latency.ttft.count": 500.0, "latency.ttft.mean_s": 0.07,  # (28 + 7) / 500
        "latency.ttft.p50_s": 0.06 + 0.02 * 100 / 230,  # rank 250 in (0.06, 0.08]: cumulative 150 -> 380
        "latency.itl.metric": "vllm:inter_token_latency_seconds", "latency.itl.mean_s": 510 / 25000,
        "latency.e2e.mean_s": 2.5,  # 1250 / 500
        "counters.vllm:generation_tokens.value": 1450, "counters.vllm:num_requests_running.value": 1.5,
        "counters.vllm:spec_decode_num_drafts.type": "counter",
    }),
    Case("vllm_v1_metrics_off.prom", {  # no speculation: no spec-decode family, nothing measured
        "engine": "vllm", "spec_decode.source": NOT_MEASURED, "spec_decode.num_drafts": NOT_MEASURED,
        "spec_decode.mean_acceptance_length": NOT_MEASURED, "spec_decode.draft_acceptance_rate": NOT_MEASURED,
        "spec_decode.warnings": Has("exposes no spec-decode metrics"),
        "latency.ttft.p50_s": 0.05,  # rank 100 in (0.04, 0.06]: cumulative 50 -> 150
        "latency.itl.metric": "vllm:time_per_output_token_seconds",  # the v0.9 name of the per-token gap
        "latency.itl.mean_s": 0.02, "latency.itl.p50_s": 0.0175,  # 796 / 39800; 0.01 + 0.015 / 2
        "latency.e2e.mean_s": 4.23, "latency.e2e.p50_s": 3.75,
        "counters.vllm:generation_tokens.value": 40000, "counters.vllm:request_success.value": 200,
    }),
    Case("vllm_v0_metrics.prom", {  # drafts derived: 900 emitted - 600 accepted
        "spec_decode.source": "vllm v0", "spec_decode.num_drafts": 300.0,
        "spec_decode.mean_acceptance_length": 3.0, "spec_decode.draft_acceptance_rate": 0.5,
    }),
    Case("vllm_per_request_spec_stream.sse", {
        "engine": "vllm", "version": "vllm-0.29.0", "text": "One two three four five six seven eight nine ten.",
        "per_request_spec.drafts": 4, "per_request_spec.draft_tokens": 12, "per_request_spec.accepted": 6,
        "stream.completion_tokens": 11, "stream.mean_tokens_per_chunk": 11 / 4,
    }),
    Case("vllm_reasoning_stream.sse", {  # vLLM >= 0.10 names the reasoning delta "reasoning"
        "reasoning": "The user asks for 7 times 6, which is 42.", "text": "7 × 6 = 42.",
        "stream.token_chunks": 6, "stream.completion_tokens": 12, "stream.mean_tokens_per_chunk": 2.0,
        "per_request_spec": NOT_MEASURED, "spec_decode": NOT_MEASURED,
    }),
    Case("vllm_bench_append.jsonl", {
        "format": "vllm-bench", "engine": "vllm",
        "records.0.spec_decode": NOT_MEASURED, "records.0.spec_decode_note": Has("no spec_"),
        "records.1.spec_decode.mean_acceptance_length": 2.5, "records.1.spec_decode.draft_acceptance_rate": 0.5,
        "records.1.request_goodput_req_s": 2.9,  # the old "request_goodput:" key
        "records.1.spec_decode.warnings": Lacks("inconsistent"),
        "records.2.spec_decode.warnings": Has("inconsistent"),  # 1 + 0.8 + 0.5 = 2.3, not 2.5
    }),
    Case("vllm_bench_serve_spec.json", {
        "format": "vllm-bench", "records.0.requests_ok": 200,
        "records.0.spec_decode.num_drafts": 1000, "records.0.spec_decode.mean_acceptance_length": 3.2,
        "records.0.spec_decode.draft_acceptance_rate": 0.55,  # 55.0 % stored in percent
        "records.0.spec_decode.per_position_rates": [0.8, 0.6, 0.45, 0.35],
        "records.0.spec_decode.conditional_rates": [0.8, 0.6 / 0.8, 0.45 / 0.6, 0.35 / 0.45],
        "records.0.spec_decode.warnings": Lacks("inconsistent"),  # 1 + 2.2 = 3.2 = 1 + 2200/1000
        "records.0.tpot_ms.p50": 9.5, "records.0.e2el_ms.p99": 1500.0, "records.0.chunk_itl_ms.mean": 30.7,
    }),
    # --- TGI ---------------------------------------------------------------------------------------------
    Case("tgi_metrics.prom", {
        "engine": "tgi", "spec_decode.source": NOT_MEASURED, "spec_decode.warnings": Has("no spec-decode"),
        "latency.tpot.metric": "tgi_request_mean_time_per_token_duration", "latency.e2e.mean_s": 1.2,
        "latency.ttft": ABSENT, "latency.tpot.definition": Has("one value per request"),
    }),
    Case("tgi_generate_stream.sse", {  # one event per token; the EOS token special (no text)
        "text": " Paris is the capital.", "stream.token_chunks": 5,
        "stream.completion_tokens": 6,  # details.generated_tokens of the last event
        "stream.mean_tokens_per_chunk": 6 / 5, "spec_decode": NOT_MEASURED, "per_request_spec": NOT_MEASURED,
    }),
    # --- guidellm -----------------------------------------------------------------------------------------
    Case("guidellm_report.json", {
        "format": "guidellm", "engine": None, "version": "guidellm 0.8.1 (report schema 2)",
        "records.0.strategy": "synchronous", "records.0.requests_ok": 2, "records.0.requests_failed": 1,
        "records.0.tpot_ms.p50": 5.2,  # guidellm's inter_token_latency_ms is the probe's TPOT
        "records.0.tpot_incl_ttft_ms.mean": 6.4, "records.0.e2el_ms.mean": 610.0,
        "records.0.mean_tokens_per_chunk": 192 / 80,  # pooled over the per-request records
        "records.0.spec_decode": NOT_MEASURED, "records.1.ttft_ms.p99": 400.0,
    }),
    Case("guidellm_v03_report.json", {  # the older layout: args.strategy, the benchmark's own request_totals
        "format": "guidellm", "version": NOT_MEASURED, "records.0.strategy": "synchronous",
        "records.0.requests_ok": 10, "records.0.requests_failed": 0, "records.0.wall_time_s": 30.0,
        "records.0.ttft_ms.p50": 44.0, "records.0.tpot_ms.p50": 11.0, "records.0.e2el_ms.mean": 3000.0,
        "records.0.mean_tokens_per_chunk": NOT_MEASURED,  # guidellm 0.3 counts no streaming iterations
        "records.1.strategy": "throughput", "records.1.requests_ok": 98, "records.1.requests_incomplete": 2,
        "records.1.ttft_ms.p50": 400.0, "records.1.output_throughput_tok_s": 612.5,
        "records.2.strategy": "constant", "records.2.requests_ok": 59, "records.2.requests_failed": 1,
        "records.2.tpot_ms.p99": 21.0, "records.2.total_output_tokens": 256.0 * 59,
    }),
]


@pytest.mark.parametrize("case", CASES, ids=[c.file for c in CASES])
def test_every_fixture_reads_as_computed_by_hand(case: Case) -> None:
    found = case.read(case.file)
    wrong = {path: (pick(found, path), want) for path, want in case.expect.items()
             if (want is ABSENT) != (pick(found, path) is ABSENT) or
             (want is not ABSENT and pick(found, path) != expected(want))}
    assert not wrong, wrong


def test_the_table_holds_every_fixture_and_the_readme_names_each() -> None:
    files = sorted(p.name for p in DATA.iterdir() if p.name != "README.md")
    assert sorted(c.file for c in CASES) == files and len(files) >= 23
    readme = (DATA / "README.md").read_text()
    assert [f for f in files if f"`{f}`" not in readme] == []


@pytest.mark.parametrize("name", [c.file for c in CASES])
def test_inspect_shows_every_fixture(name: str) -> None:
    """``specledger inspect`` sniffs each file's format and prints its table and JSON without an error."""
    res = CliRunner().invoke(cli_app, ["inspect", str(DATA / name), "--json"])
    assert res.exit_code == 0, res.output
    assert "pooled acceptance length" in json.loads(res.output)["definitions"]
    table = CliRunner().invoke(cli_app, ["inspect", str(DATA / name)], terminal_width=200)
    assert table.exit_code == 0 and "(format detected)" in " ".join(table.output.split()), table.output
