"""Engines other than vLLM v1, read without loss: llama.cpp, SGLang, TGI and vLLM v0 metrics, llama.cpp
streams, vLLM bench JSON Lines (issue 21): the behaviour around the readers (a live probe of a llama.cpp replay,
consistency warnings, JSON Lines records, imports, unreadable files). What each fixture of tests/data/engines
reads as, figure by figure, is the table of tests/test_engine_fixtures.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.errors import SpecLedgerError
from specledger.ledger.server_acceptance import per_position_mismatch
from specledger.probe.endpoint import probe_endpoint
from specledger.probe.loadgen import LoadConfig, PromptItem
from specledger.probe.metrics import response_timings_figures
from specledger.probe.prometheus import EMPTY_SNAPSHOT, parse_prometheus_text
from specledger.probe.spec_figures import spec_decode_figures
from specledger.probe.sse import SSEEvent, interpret_event
from specledger.probe.vllm_bench import load_vllm_bench, load_vllm_bench_records, parse_vllm_bench
from tests.fake_server import FakeServer

DATA = Path(__file__).parent / "data" / "engines"


# --- llama.cpp ------------------------------------------------------------------------------


def test_response_timings_are_pooled_over_responses() -> None:
    """Σ accepted / Σ drafted over the responses that drafted (a response without draft fields is left out);
    the per-response mean weighs each response the same (the fixtures' own figures: test_engine_fixtures)."""
    figures = response_timings_figures([{"draft_n": 12, "draft_n_accepted": 7}, {"draft_n": 8, "draft_n_accepted": 1},
                                        {"predicted_n": 3}])
    assert figures["responses"] == 2 and figures["draft_acceptance_rate"] == pytest.approx(8 / 20)
    assert figures["mean_request_acceptance_rate"] == pytest.approx((7 / 12 + 1 / 8) / 2)


def llamacpp_app() -> FastAPI:
    """Replays the llama.cpp fixtures: the stream for every request, and /metrics whose counters are the
    fixture's times the number of requests served (so a probe window sees a delta)."""
    app = FastAPI()
    served = {"n": 0}
    metrics_text = (DATA / "llamacpp_metrics.prom").read_text()
    stream = (DATA / "llamacpp_reasoning_stream.sse").read_bytes()

    def scaled(line: str) -> str:
        if line.startswith("#") or not line.strip():
            return line
        name, value = line.rsplit(" ", 1)
        return f"{name} {float(value) * served['n']}"

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": [{"id": "qwen3-8b"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("\n".join(scaled(x) for x in metrics_text.splitlines()) + "\n")

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        served["n"] += 1
        return StreamingResponse(iter([stream]), media_type="text/event-stream")

    return app


def test_probe_reads_llamacpp_metrics_and_timings_live() -> None:
    with FakeServer(app=llamacpp_app()) as server:
        config = LoadConfig(base_url="", model="", chat=True, concurrency=1, num_requests=2)
        report = probe_endpoint(server.url, config, [PromptItem(prompt="2+2?")])
    spec = report["spec_decode"]
    assert spec["source"] == "llama.cpp" and spec["num_drafts"] == 400
    assert spec["mean_acceptance_length"] == pytest.approx(2.5)
    assert report["spec_decode_counters"]["after"]["engine"] == "llama.cpp"
    summary = report["summary"]
    assert summary["requests_ok"] == 2 and summary["response_timings"]["num_draft_tokens"] == 24
    assert summary["mean_tokens_per_chunk"] is not None  # reasoning chunks are timed, not empty
    (first,) = [r for r in report["results"] if r["index"] == 0]
    assert first["reasoning_text"] == "Let me think about 2+2." and first["output_text"] == "4"
    assert len(first["chunk_times"]) == 3
    assert report["server_rates"]["generation speed per slot (tok/s)"]["value"] == pytest.approx(100.0)


# --- SGLang, TGI, vLLM v0 ---------------------------------------------------------------------


def test_a_speculating_sglang_rank_is_averaged_without_the_ranks_that_do_not() -> None:
    """SGLang's 0 is its "off", not a measured length (a measured one counts the bonus token, so it is >= 1):
    the dump's raw gauge averages the rank that speculates only (the off server: test_engine_fixtures)."""
    from specledger.probe.inspect_file import inspect_prometheus

    text = ('# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{dp_rank="0"} 3.0\n'
            'sglang:spec_accept_length{dp_rank="1"} 0\n')
    assert inspect_prometheus(text)["counters"]["sglang:spec_accept_length"]["value"] == pytest.approx(3.0)


def test_sglang_zero_rank_left_out_of_the_mean() -> None:
    text = 'sglang:spec_accept_length{dp_rank="0"} 3.0\nsglang:spec_accept_length{dp_rank="1"} 0\n'
    fig = spec_decode_figures(EMPTY_SNAPSHOT, parse_prometheus_text(text))
    assert not fig.off and fig.sglang_accept_length == pytest.approx(3.0)


# --- consistency ----------------------------------------------------------------------------------


def test_per_position_consistency_warns_on_missing_positions() -> None:
    text = (
        "vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total 300\n"
        "vllm:spec_decode_num_accepted_tokens_total 150\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 80\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 20\n'
    )
    fig = spec_decode_figures(EMPTY_SNAPSHOT, parse_prometheus_text(text))
    assert any("lacks position(s) 1" in w for w in fig.warnings)
    assert any("inconsistent spec-decode figures" in w for w in fig.warnings)
    assert per_position_mismatch(2.5, [0.8, 0.5, 0.2]) is None
    assert per_position_mismatch(2.5, [0.8, 0.5]) is not None


# --- vllm bench: JSON Lines, old goodput key, missing spec figures --------------------------------


def test_vllm_bench_json_lines_records() -> None:
    records = load_vllm_bench_records(DATA / "vllm_bench_append.jsonl")
    assert [r.max_concurrency for r in records] == [1, 8, 16]
    with pytest.raises(SpecLedgerError, match="holds 3 results .*--record N"):
        load_vllm_bench(DATA / "vllm_bench_append.jsonl")


def test_vllm_bench_json_lines_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"completed": 1}\n{"completed": 2}\n{oops\n')
    with pytest.raises(SpecLedgerError, match="line 3 is not JSON.*JSON Lines"):
        load_vllm_bench_records(path)


def test_vllm_bench_old_goodput_key() -> None:
    result = parse_vllm_bench({"completed": 3, "request_goodput:": 2.5})
    assert result.request_goodput == 2.5 and "request_goodput:" not in (result.model_extra or {})
    assert result.summary()["request_goodput_req_s"] == 2.5
    assert parse_vllm_bench({"request_goodput": 1.0, "request_goodput:": 2.0}).request_goodput == 1.0


def test_vllm_bench_without_spec_says_why_for_a_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"completed": 4, "median_tpot_ms": 20.0}))
    res = CliRunner().invoke(cli_app, ["import-vllm-bench", str(path)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "--no-metrics" not in res.output and "no spec_decode_* fields" in res.output


def test_import_vllm_bench_json_lines_one_run_dir_per_record(tmp_path: Path) -> None:
    src = DATA / "vllm_bench_append.jsonl"
    out = tmp_path / "runs"
    res = CliRunner().invoke(cli_app, ["import-vllm-bench", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["record-1", "record-2", "record-3"]
    doc = json.loads((out / "record-2" / "vllm_bench.json").read_text())
    assert doc["summary"]["spec_decode"]["mean_acceptance_length"] == 2.5
    assert doc["summary"]["request_goodput_req_s"] == 2.9
    one = tmp_path / "one"
    res = CliRunner().invoke(cli_app, ["import-vllm-bench", str(src), "--record", "2", "--out", str(one), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["spec_decode"]["num_drafts"] == 1000 and (one / "vllm_bench.json").is_file()
    bad = CliRunner().invoke(cli_app, ["import-vllm-bench", str(src), "--record", "4"])
    assert bad.exit_code != 0


def test_tgi_generate_stream_event() -> None:
    chunk = interpret_event(SSEEvent(data='{"token":{"id":5,"text":" hi","logprob":-0.1,"special":false}}'))
    assert chunk.kind == "delta" and chunk.text == " hi"
    special = interpret_event(SSEEvent(data='{"token":{"id":2,"text":"</s>","special":true}}'))
    assert special.text == ""


# --- inspect, import -------------------------------------------------------------------------------------


def test_inspect_lists_what_it_could_not_read(tmp_path: Path) -> None:
    from specledger.probe.inspect_file import inspect_file

    hist = tmp_path / "hist.prom"
    hist.write_text("# TYPE vllm:request_prompt_tokens histogram\n"
                    'vllm:request_prompt_tokens_bucket{le="+Inf"} 3\nvllm:request_prompt_tokens_sum 30\n'
                    "vllm:request_prompt_tokens_count 3\n")
    assert any("not mapped" in line and "vllm:request_prompt_tokens" in line for line in inspect_file(hist)["unread"])
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"completed": 1, "endpoint_type": "x"}\n{"completed": "many"}\n')
    mixed = inspect_file(path)
    assert len(mixed["records"]) == 1 and any("line 2" in line for line in mixed["unread"])


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00binary", b"just some words\n", b"[1, 2]", b'{"a": '])
def test_inspect_unreadable_file_is_one_line_exit_2(tmp_path: Path, content: bytes, capsys) -> None:
    from specledger.cli import main

    path = tmp_path / "f"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main(["inspect", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_import_sniffs_guidellm_and_writes_run_dirs(tmp_path: Path) -> None:
    out = tmp_path / "gl"
    res = CliRunner().invoke(cli_app, ["import", str(DATA / "guidellm_report.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["record-1", "record-2"]
    assert json.loads((out / "record-1" / "run.json").read_text())["kind"] == "guidellm"
    page = (out / "record-2" / "report.html").read_text()
    assert 'id="guidellm"' in page and "guidellm 0.8.1" in page
    one = tmp_path / "one"
    res = CliRunner().invoke(cli_app, ["import", str(DATA / "vllm_bench_append.jsonl"), "--record", "3",
                                       "--out", str(one)])
    assert res.exit_code == 0, res.output
    assert json.loads((one / "run.json").read_text())["kind"] == "vllm-bench"
    report = CliRunner().invoke(cli_app, ["report", str(out / "record-1")])
    assert report.exit_code == 0 and "guidellm" in report.output
