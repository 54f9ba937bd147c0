"""Probe metrics math, load generator, CLI, end to end against tests/fake_server.py (loopback)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specledger.analysis.stats import distribution
from specledger.cli.probe import import_vllm_bench, probe
from specledger.errors import SpecLedgerError
from specledger.load_points import poisson_arrivals
from specledger.probe.endpoint import normalize_base_url, probe_endpoint
from specledger.probe.loadgen import (
    LoadConfig,
    PromptItem,
    RequestResult,
    load_prompt_items,
    reconcile_chunk_tokens,
    run_load,
)
from specledger.probe.metrics import (
    chunk_itls,
    request_tpot,
    speedup,
    summarize,
    token_itls,
)

sys.path.insert(0, str(Path(__file__).parent))
from fake_server import FakeServer, FakeServerConfig, chunk_sizes, expected_tokens  # noqa: E402

# --- metrics math -------------------------------------------------------------------------


def hand_made() -> RequestResult:
    # first chunk at 0.1 s with 2 tokens, then 1 token after 0.05, then 3 tokens after 0.2
    return RequestResult(
        index=0,
        ok=True,
        ttft_s=0.1,
        chunk_times=[0.1, 0.15, 0.35],
        chunk_tokens=[2, 1, 3],
        completion_tokens=6,
    )


def test_token_and_chunk_itl_conventions() -> None:
    r = hand_made()
    assert token_itls(r) == pytest.approx([0.0, 0.05, 0.2, 0.0, 0.0])
    assert chunk_itls(r) == pytest.approx([0.05, 0.2])
    assert request_tpot(r) == pytest.approx(0.25 / 5)
    # invariant: token ITLs number tokens-1 and sum to last - first, so their mean is the TPOT
    assert len(token_itls(r)) == 5 and sum(token_itls(r)) == pytest.approx(0.25)


def test_summary_on_hand_made_results() -> None:
    ok = hand_made()
    single = RequestResult(
        index=1, ok=True, ttft_s=0.3, chunk_times=[0.3], chunk_tokens=[1], completion_tokens=1
    )
    failed = RequestResult(index=2, ok=False, status=500, error="HTTP 500: boom")
    broken = RequestResult(index=3, ok=False, error="ReadTimeout: timed out")
    s = summarize([ok, single, failed, broken], wall_time_s=2.0)
    assert (s["requests_ok"], s["requests_failed"]) == (2, 2)
    assert s["errors"] == {"HTTP 500": 1, "ReadTimeout": 1}
    assert s["total_output_tokens"] == 7 and s["output_throughput_tok_s"] == pytest.approx(3.5)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["n"] == 1 and s["pooled_tpot_ms"] == pytest.approx(50.0)
    assert s["longest_stall_ms"] == pytest.approx(200.0)
    assert s["mean_tokens_per_chunk"] == pytest.approx(7 / 4)
    assert s["token_itl_ms"]["n"] == 5 and s["chunk_itl_ms"]["n"] == 2


def test_percentiles_match_numpy() -> None:
    values = [0.001 * i for i in range(1, 101)]
    out = distribution(values, 1e3)
    assert out["p95"] == pytest.approx(float(np.percentile(values, 95)) * 1000)
    assert out["p50"] == pytest.approx(50.5) and out["max"] == pytest.approx(100.0)
    assert distribution([], 1e3)["p99"] is None


def test_speedup_ratios() -> None:
    cand = {"output_throughput_tok_s": 300.0, "pooled_tpot_ms": 10.0, "ttft_ms": {"p50": 50.0}}
    base = {"output_throughput_tok_s": 100.0, "pooled_tpot_ms": 25.0, "ttft_ms": {"p50": 40.0}}
    assert speedup(cand, base) == pytest.approx(
        {"throughput_ratio": 3.0, "tpot_ratio": 2.5, "ttft_p50_ratio": 0.8}
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=12),
    st.lists(st.floats(0, 10), min_size=12, max_size=12),
    st.integers(0, 60),
)
def test_reconcile_sums_to_total(counts: list[int], weights: list[float], total: int) -> None:
    out = reconcile_chunk_tokens(counts, weights[: len(counts)], total)
    assert sum(out) == total and len(out) == len(counts)
    if total >= len(counts):
        assert min(out) >= 1


def test_reconcile_proportional_to_equal_width_text() -> None:
    assert reconcile_chunk_tokens([1, 1, 1], [4, 12, 8], 6) == [1, 3, 2]


def test_poisson_arrivals_seeded() -> None:
    a = poisson_arrivals(5.0, 2000, seed=3)
    assert a == poisson_arrivals(5.0, 2000, seed=3) and a != poisson_arrivals(5.0, 2000, seed=4)
    assert np.all(np.diff(a) > 0)
    assert np.mean(np.diff(a)) == pytest.approx(0.2, rel=0.1)


# --- workloads ----------------------------------------------------------------------------


@dataclass
class ItemLike:
    prompt: str | None = None
    messages: list | None = None


def test_prompt_items_from_objects_dicts_and_jsonl(tmp_path) -> None:
    items = load_prompt_items(["hi", {"messages": [{"role": "user", "content": "yo"}]}, ItemLike(prompt="p")])
    assert items[0].as_messages() == [{"role": "user", "content": "hi"}]
    assert items[1].as_prompt() == "yo" and items[2].prompt == "p"
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a", "max_tokens": 5}\n\n{"messages": [{"role": "user", "content": "b"}]}\n')
    loaded = load_prompt_items(path)
    assert loaded[0] == PromptItem(prompt="a", max_tokens=5) and loaded[1].messages is not None
    path.write_text('{"text": "a"}\n')
    with pytest.raises(SpecLedgerError, match="neither 'prompt' nor 'messages'"):
        load_prompt_items(path)
    path.write_text("not json\n")
    with pytest.raises(SpecLedgerError, match="w.jsonl:1"):
        load_prompt_items(path)


def test_config_validation() -> None:
    with pytest.raises(SpecLedgerError, match="exactly one"):
        LoadConfig(base_url="http://127.0.0.1:1", model="m", concurrency=2, rate=1.0).validate()
    with pytest.raises(SpecLedgerError, match="--requests"):
        LoadConfig(base_url="http://127.0.0.1:1", model="m", num_requests=0).validate()
    assert normalize_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(SpecLedgerError, match="http://"):
        normalize_base_url("127.0.0.1:8000")


# --- end to end on loopback ---------------------------------------------------------------

PROMPTS = [f"prompt number {i}" for i in range(5)]


def word_tokenizer(text: str) -> list[str]:
    return text.split()


@pytest.fixture(scope="module")
def server():
    with FakeServer(FakeServerConfig(response_tokens=20, delays_s=(0.002, 0.004))) as srv:
        yield srv


def test_end_to_end_completions_matches_server(server) -> None:
    served_before = len(server.log)
    config = LoadConfig(base_url="", model="", max_tokens=15, concurrency=4, num_requests=12)
    report = probe_endpoint(
        server.url, config, load_prompt_items(PROMPTS), metrics=True, tokenizer=word_tokenizer
    )
    served = server.log[served_before:]
    assert report["model"] == "fake-model" and len(served) == 12
    summary = report["summary"]
    assert summary["requests_ok"] == 12 and summary["requests_failed"] == 0
    total_chunks = 0
    for result in report["results"]:
        prompt = PROMPTS[result["index"] % len(PROMPTS)]
        tokens = expected_tokens(prompt, 15, server.config)
        assert result["output_text"] == "".join(tokens)
        assert result["completion_tokens"] == result["usage_completion_tokens"] == 15
        assert result["chunk_tokens"] == chunk_sizes(15, server.config)
        assert result["token_count_source"] == "tokenizer" and result["saw_done"]
        assert result["ttft_s"] == result["chunk_times"][0] > 0
        total_chunks += len(result["chunk_tokens"])
    assert summary["total_output_tokens"] == 12 * 15
    assert summary["mean_tokens_per_chunk"] == pytest.approx(12 * 15 / total_chunks)
    assert summary["token_itl_ms"]["n"] == 12 * 14
    # the fake server counts one draft round per chunk: drafts = chunks, accepted = tokens - chunks
    spec = report["spec_decode"]
    sizes = [s for entry in served for s in entry.sizes]
    assert spec["num_drafts"] == len(sizes) == total_chunks
    assert spec["num_accepted_tokens"] == sum(sizes) - len(sizes)
    assert spec["num_draft_tokens"] == server.config.gamma * len(sizes)
    assert spec["mean_acceptance_length"] == pytest.approx(sum(sizes) / len(sizes))
    expected_rates = [sum(1 for s in sizes if s - 1 > p) / len(sizes) for p in range(server.config.gamma)]
    assert spec["per_position_rates"] == pytest.approx(expected_rates)
    assert report["server_histograms"]["ttft"]["count"] == 12
    assert report["server_histograms"]["itl"]["count"] == total_chunks - 12


def test_end_to_end_chat_poisson_without_tokenizer_reconciles_usage(server) -> None:
    config = LoadConfig(
        base_url=server.url,
        model="fake-model",
        chat=True,
        max_tokens=10,
        concurrency=None,
        rate=200.0,
        num_requests=6,
    )
    run = asyncio.run(run_load(config, load_prompt_items(PROMPTS)))
    assert [r.index for r in run.results] == list(range(6))
    for r in run.results:
        assert r.ok, r.error
        assert r.output_text == "".join(expected_tokens(PROMPTS[r.index % 5], 10, server.config))
        # 1 token per chunk, then reconciled with usage by text length (4 chars per token)
        assert r.token_count_source == "usage-reconciled"
        assert r.chunk_tokens == chunk_sizes(10, server.config) and r.completion_tokens == 10


def test_duration_bounds_the_run(server) -> None:
    config = LoadConfig(
        base_url=server.url,
        model="fake-model",
        max_tokens=20,
        concurrency=1,
        num_requests=1000,
        duration_s=0.3,
    )
    run = asyncio.run(run_load(config, [PromptItem(prompt="x")]))
    assert 1 <= len(run.results) < 1000 and run.wall_time_s < 5


def test_http_errors_are_counted_not_raised() -> None:
    with FakeServer(FakeServerConfig(fail_every=3, response_tokens=5, delays_s=(0.0,))) as srv:
        config = LoadConfig(base_url=srv.url, model="fake-model", max_tokens=5, concurrency=2, num_requests=9)
        run = asyncio.run(run_load(config, [PromptItem(prompt="x")]))
    summary = summarize(run.results, run.wall_time_s)
    assert summary["requests_failed"] == 3 and summary["errors"] == {"HTTP 500": 3}
    assert summary["total_output_tokens"] == 6 * 5


def test_incomplete_and_non_sse_answers_are_failures_with_their_reason() -> None:
    """Issue 12 item 5: a 200 whose stream lacks `data: [DONE]`, or whose body is not SSE, is a
    failure naming why -- never a success."""
    config_server = FakeServerConfig(no_done_every=3, json_every=4, response_tokens=5, delays_s=(0.0,), crlf_every=0)
    with FakeServer(config_server) as srv:
        config = LoadConfig(base_url=srv.url, model="fake-model", max_tokens=5, concurrency=1, num_requests=12)
        run = asyncio.run(run_load(config, [PromptItem(prompt="x")]))
    by_number = {r.index + 1: r for r in run.results}  # concurrency 1: the server's n-th request is index n-1
    for number, r in by_number.items():
        if number % 4 == 0:
            assert not r.ok and r.status == 200 and r.error.startswith("NotSSE: the answer is 'application/json'")
            assert "not a stream" in r.error
        elif number % 3 == 0:
            assert not r.ok and not r.saw_done and r.output_text  # the tokens came, the end did not
            assert r.error.startswith("IncompleteStream: the stream ended without `data: [DONE]`")
        else:
            assert r.ok and r.saw_done and r.error is None
    summary = summarize(run.results, run.wall_time_s)
    assert summary["errors"] == {"NotSSE": 3, "IncompleteStream": 3} and summary["requests_ok"] == 6


def test_the_timeout_bounds_a_request_s_total_time() -> None:
    """Issue 12 item 5: a stream that trickles a chunk every 50 ms never trips a 0.5 s read timeout,
    but the request is cut at 0.5 s in total and counted as a failure."""
    with FakeServer(FakeServerConfig(response_tokens=200, chunk_pattern=(1,), delays_s=(0.05,))) as srv:
        config = LoadConfig(base_url=srv.url, model="fake-model", max_tokens=200, concurrency=2, num_requests=2,
                            timeout_s=0.5)
        t0 = time.perf_counter()
        run = asyncio.run(run_load(config, [PromptItem(prompt="x")]))
        wall = time.perf_counter() - t0
    assert wall < 6.0  # the full stream would take 10 s
    for r in run.results:
        assert not r.ok and r.error.startswith("TotalTimeout: no complete answer within 0.5 s (after ")
        assert 0 < len(r.chunk_times) < 200 and r.end_s - r.start_s < 5.0
    assert summarize(run.results, run.wall_time_s)["errors"] == {"TotalTimeout": 2}


def cli_app() -> typer.Typer:
    app = typer.Typer()
    app.command("probe")(probe)
    app.command("import-vllm-bench")(import_vllm_bench)
    return app


def test_cli_probe_json_out_and_baseline(server, tmp_path) -> None:
    runner = CliRunner()
    args = [
        "probe",
        server.url,
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--max-tokens",
        "8",
        "--baseline",
        server.url,
        "--out",
        str(tmp_path),
        "--json",
    ]
    result = runner.invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["probe"]["summary"]["requests_ok"] == 4 and "results" not in printed["probe"]
    assert printed["speedup"]["throughput_ratio"] > 0
    saved = json.loads((tmp_path / "probe.json").read_text())
    assert len(saved["probe"]["results"]) == 4 and len(saved["baseline"]["results"]) == 4
    table = runner.invoke(cli_app(), ["probe", server.url, "--requests", "2", "--max-tokens", "4", "--chat"])
    assert table.exit_code == 0 and "TPOT" in table.output and "server-wide" in table.output


def test_cli_unreachable_url_is_one_line_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(SpecLedgerError, match="cannot reach http://127.0.0.1"):
        probe(f"http://127.0.0.1:{port}", requests=1, max_tokens=2)


def test_cli_import_vllm_bench(tmp_path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(
            {
                "completed": 10,
                "median_tpot_ms": 20.0,
                "spec_decode_acceptance_length": 2.0,
                "spec_decode_acceptance_rate": 50.0,
                "spec_decode_per_position_acceptance_rates": [0.6, 0.4],
            }
        )
    )
    result = CliRunner().invoke(cli_app(), ["import-vllm-bench", str(path), "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["tpot_ms"]["p50"] == 20.0 and summary["spec_decode"]["draft_acceptance_rate"] == 0.5
    assert (tmp_path / "vllm_bench.json").exists()
    table = CliRunner().invoke(cli_app(), ["import-vllm-bench", str(path)])
    assert table.exit_code == 0 and "acceptance" in table.output
