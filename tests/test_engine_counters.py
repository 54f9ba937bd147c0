"""Everything an engine says about speculation, per request and per server, read once and reconciled (issue 35,
part B): llama.cpp's cumulative ``timings`` (the last snapshot per response, never a sum of snapshots), a
``timings`` without draft fields, a llama.cpp /metrics dump's own counters, vLLM's and SGLang's per-request
figures, and :func:`specledger.probe.counters.engine_counters`.

``llamacpp_live_*`` are real captures of llama-server (built from the llama-cpp-python 0.3.36 sources); the
vLLM and SGLang streams are hand-written from their sources (tests/data/engines/README.md). What each fixture
reads as, and how its per-request sums reconcile with its server's counters, is the table of
tests/test_engine_fixtures.py; the behaviour of the readers and the reconciler is tested here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.probe.counters import (
    counts_from_spec_stats,
    counts_from_timings,
    engine_counters,
    rel_diff,
    request_counts,
)
from specledger.probe.inspect_file import inspect_file, split_responses
from specledger.probe.loadgen import LoadConfig, PromptItem, RequestResult, run_load
from specledger.probe.metrics import response_timings_totals
from specledger.probe.records import records_from_probe
from specledger.probe.sse import interpret_event, parse_sse

DATA = Path(__file__).parent / "data" / "engines"


def chunks_of(name: str) -> list:
    return [interpret_event(e) for e in parse_sse((DATA / name).read_text())]


def prom(name: str) -> str:
    return (DATA / name).read_text()


# --- defect 1: cumulative timings are snapshots, not increments ------------------------------------------


def test_the_issue_example_is_one_response_of_12_over_32(tmp_path: Path) -> None:
    def chunk(text: str, draft_n: int, accepted: int, finish: str | None = None) -> str:
        obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}],
            "timings": {"predicted_n": 20, "draft_n": draft_n, "draft_n_accepted": accepted}}
        return f"data: {json.dumps(obj)}\n\n"

    path = tmp_path / "capture.sse"
    path.write_text(chunk("a", 30, 12) + chunk("", 32, 12, "stop") + "data: [DONE]\n\n")
    res = CliRunner().invoke(cli_app, ["inspect", str(path)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "12 / 32 = 0.375 over 1 responses" in res.output
    assert "24 / 62" not in res.output


def test_responses_split_where_the_id_changes_without_done() -> None:
    text = "".join(f'data: {{"id": "{rid}", "choices": [{{"delta": {{"content": "x"}}}}], '
                   f'"timings": {{"draft_n": {n}, "draft_n_accepted": 1}}}}\n\n'
                   for rid, n in (("a", 4), ("a", 8), ("b", 3), ("b", 5)))
    responses = split_responses([interpret_event(e) for e in parse_sse(text)])
    assert [[c.response_id for c in r] for r in responses] == [["a", "a"], ["b", "b"]]
    assert [r[-1].timings["draft_n"] for r in responses] == [8, 5]


# --- defect 2: timings without draft fields ----------------------------------------------------------------


def test_timings_without_draft_fields_are_shown() -> None:
    """Real capture of a server without speculation: llama.cpp leaves draft_n out; the rest still shows in the
    table (the figures themselves: test_engine_fixtures)."""
    table = CliRunner().invoke(cli_app, ["inspect", str(DATA / "llamacpp_live_off_stream.sse")], terminal_width=200)
    assert "timings predicted ms" in table.output and "386.51" in table.output


def test_timings_totals_add_last_snapshots_and_treat_missing_draft_fields_as_zero() -> None:
    totals = response_timings_totals([{"predicted_n": 32, "predicted_ms": 329.076, "prompt_ms": 98.958},
                                      {"predicted_n": 10, "predicted_ms": 1.0, "draft_n": 6, "draft_n_accepted": 2}])
    assert totals["predicted_n"] == 42 and totals["predicted_ms"] == pytest.approx(330.076)
    assert totals["prompt_ms"] == pytest.approx(98.958) and totals["draft_n"] == 6
    assert totals["cache_n"] is None and response_timings_totals([]) is None
    hostile = response_timings_totals([{"predicted_ms": 1e308}, {"predicted_ms": 1e308}, {"predicted_n": "x"}])
    assert hostile["predicted_ms"] == float("inf") and hostile["predicted_n"] == 0


# --- defect 3: a dump's own counters ------------------------------------------------------------------------


def test_counters_of_labelled_series_are_summed_and_gauges_averaged(tmp_path: Path) -> None:
    path = tmp_path / "m.prom"
    path.write_text('# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine="0"} 5\n'
                    'vllm:prompt_tokens_total{engine="1"} 7\n# TYPE vllm:num_requests_running gauge\n'
                    'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_running{engine="1"} 3\n')
    counters = inspect_file(path)["counters"]
    assert counters["vllm:prompt_tokens"] == {"type": "counter", "value": 12, "series": 2, "help": ""}
    assert counters["vllm:num_requests_running"]["value"] == 2
    path.write_text("vllm:gpu_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc{engine=\"1\"} 0.25\n")  # no TYPE
    assert inspect_file(path)["counters"]["vllm:gpu_cache_usage_perc"]["value"] == 0.75


# --- per-request figures of vLLM and SGLang ---------------------------------------------------------------


@pytest.mark.parametrize(("details", "expected"), [
    ({"spec_verify_ct": 3, "spec_num_proposed_drafts": 9, "spec_num_correct_drafts": 2}, (3, 9, 2)),  # >= 0.5.12
    ({"spec_verify_ct": 3, "spec_proposed_drafts": 9, "spec_accepted_drafts": 2}, (3, 9, 2)),  # 0.5.11
    ({"spec_verify_ct": 3, "spec_draft_token_num": 9, "spec_accept_token_num": 2}, (3, 9, 2)),  # 0.5.6 - 0.5.10
    ({"spec_verify_ct": 3}, (3, None, None)),  # 0.4 - 0.5.5
    ([{"spec_verify_ct": 1, "spec_num_proposed_drafts": 3, "spec_num_correct_drafts": 1},
      {"spec_verify_ct": 2, "spec_num_proposed_drafts": 6, "spec_num_correct_drafts": 4}], (3, 9, 5)),  # n = 2
])
def test_sglang_field_names_of_every_version(details: Any, expected: tuple) -> None:
    counts = counts_from_spec_stats({"source": "sglang", "details": details})
    assert (counts.drafts, counts.draft_tokens, counts.accepted) == expected


def test_what_is_not_a_count_is_not_counted() -> None:
    assert counts_from_timings({"draft_n": 5, "draft_n_accepted": 9}).accepted is None  # more accepted than drafted
    assert counts_from_timings({"draft_n": True, "draft_n_accepted": 0}).draft_tokens is None
    assert counts_from_timings({"draft_n": float("nan"), "draft_n_accepted": 0}).draft_tokens is None
    assert counts_from_timings({"predicted_n": 3}).draft_tokens == 0  # llama.cpp: nothing drafted
    assert counts_from_timings({"draft_n": 10**400, "draft_n_accepted": 0}).draft_tokens is None
    huge = engine_counters([{"server_timings": {"draft_n": 10**400}}], None, "llamacpp:spec_decode_num_drafts 1e308")
    assert huge["per_request_sum"]["draft_tokens"] is None and huge["server"]["drafts"] == 1e308
    assert counts_from_spec_stats({"source": "vllm", "details": {"num_draft_tokens": -4}}).draft_tokens is None
    assert counts_from_spec_stats({"source": "other", "details": {}}) is None
    garbage = {"id": "x", "choices": [], "metrics": "fast", "sglext": {"spec_tokens_details": [1, 2]}}
    assert interpret_event(type("E", (), {"data": json.dumps(garbage)})()).spec_stats is None


def _sse_app(body: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def test_the_load_generator_keeps_the_engine_figures_and_records_carry_them() -> None:
    body = (DATA / "sglang_spec_details_stream.sse").read_text().split("data: [DONE]")[0] + "data: [DONE]\n\n"
    config = LoadConfig(base_url="http://engine", model="m", chat=True, concurrency=1, num_requests=2)

    async def go() -> list[RequestResult]:
        async with httpx.AsyncClient(transport=_sse_app(body)) as client:
            return (await run_load(config, [PromptItem(prompt="hi", id="p1")], client=client)).results

    results = asyncio.run(go())
    assert all(r.ok for r in results) and results[0].server_spec["source"] == "sglang"
    assert results[0].to_dict()["server_spec"]["details"]["spec_verify_ct"] == 5
    records = records_from_probe(results, drafter="eagle", gamma=3, temperature=0.0, model="m",
                                 endpoint="http://engine", category_of=lambda _: "all")
    assert records[0].extra["engine_spec"] == {"drafts": 5, "draft_tokens": 15, "accepted": 7,
                                               "source": "SGLang sglext.spec_tokens_details"}
    assert request_counts(records[0]) == request_counts(results[0])


# --- the reconciliation -------------------------------------------------------------------------------------


def test_summing_every_snapshot_is_caught_as_disagreement() -> None:
    every = [{"server_timings": c.timings} for c in chunks_of("llamacpp_live_spec_stream.sse") if c.timings]
    out = engine_counters(every, prom("llamacpp_live_metrics_before.prom"), prom("llamacpp_live_metrics_after.prom"))
    assert out["agree"] is False and out["per_request_sum"]["draft_tokens"] == 8 * 25 + 21 * 60
    assert "disagree" in out["verdict"]


VLLM_BEFORE = ("vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total 300\n"
               "vllm:spec_decode_num_accepted_tokens_total 150\n")


def _vllm_after(drafts: int, tokens: int, accepted: int) -> str:
    return (f"vllm:spec_decode_num_drafts_total {100 + drafts}\nvllm:spec_decode_num_draft_tokens_total "
            f"{300 + tokens}\nvllm:spec_decode_num_accepted_tokens_total {150 + accepted}\n")


def _vllm_request(steps: int, tokens: int, accepted: int) -> dict:
    return {"server_spec": {"source": "vllm", "details": {"num_spec_steps": steps, "num_draft_tokens": tokens,
                                                          "num_accepted_draft_tokens": accepted}}}


@pytest.mark.parametrize(("server_accepted", "agree"), [(1000, True), (1009, True), (1011, False), (990, True),
                                                        (980, False)])
def test_agreement_is_within_one_percent(server_accepted: int, agree: bool) -> None:
    per_request = [_vllm_request(200, 600, 500), _vllm_request(200, 600, 500)]
    out = engine_counters(per_request, VLLM_BEFORE, _vllm_after(400, 1200, server_accepted))
    assert out["agree"] is agree
    assert out["rel_diff"]["accepted"] == pytest.approx(rel_diff(1000, server_accepted))


def test_nothing_to_reconcile_says_why() -> None:
    out = engine_counters([RequestResult(index=0, ok=True)], VLLM_BEFORE, _vllm_after(4, 12, 6))
    assert out["agree"] is None and out["requests_reporting"] == 0
    assert "--per-request-spec-decode-metrics" in out["verdict"]
    sglang = engine_counters([{}], None, prom("sglang_spec_metrics_after.prom"))
    assert "return_spec_tokens_details" in sglang["verdict"]
    none = engine_counters([], None, None)
    assert none["agree"] is None and none["server"] == {"drafts": None, "draft_tokens": None, "accepted": None}


def test_a_counter_that_went_backwards_is_not_reconciled() -> None:
    out = engine_counters([_vllm_request(1, 3, 1)], _vllm_after(50, 50, 50), VLLM_BEFORE)
    assert out["agree"] is None and out["server"]["drafts"] is None
    assert "went backwards" in out["verdict"]


def test_requests_that_returned_nothing_are_named_in_the_verdict() -> None:
    out = engine_counters([_vllm_request(4, 12, 6), {}], VLLM_BEFORE, _vllm_after(4, 12, 6))
    assert out["agree"] is True and out["requests"] == 2 and out["requests_reporting"] == 1
    assert "1 request(s) returned no figures" in out["verdict"]


def test_a_probe_report_reconciles_from_its_own_entries() -> None:
    """What ``probe`` writes (results as dicts, spec_decode_counters before/after) is enough to reconcile."""
    report = {"results": [RequestResult(index=i, ok=True, server_timings={"draft_n": 30, "draft_n_accepted": 12}
                                        ).to_dict() for i in range(3)],
              "spec_decode_counters": {
                  "before": {"engine": "llama.cpp", "num_drafts": 10.0, "num_draft_tokens": 100.0,
                             "num_accepted_tokens": 40.0},
                  "after": {"engine": "llama.cpp", "num_drafts": 13.0, "num_draft_tokens": 190.0,
                            "num_accepted_tokens": 76.0}}}
    counters = report["spec_decode_counters"]
    out = engine_counters(report["results"], counters["before"], counters["after"])
    assert out["server"] == {"drafts": 3, "draft_tokens": 90, "accepted": 36}
    assert out["per_request_sum"] == {"drafts": None, "draft_tokens": 90, "accepted": 36} and out["agree"] is True
    assert engine_counters(report["results"], None, {"engine": "llama.cpp"})["agree"] is None
