"""Probe results as a run folder: records, run.json, the report's ledger and four gates (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.errors import SpecLedgerError
from specledger.gates import FAIL, PASS, greedy_correctness
from specledger.ledger.server_acceptance import acceptance_ledger
from specledger.probe.loadgen import RequestResult
from specledger.probe.outputs import check_new_run_dir
from specledger.probe.records import check_label, emission_times, gamma_label, records_from_probe
from specledger.probe.workload import workload_from_jsonl, workload_from_prompts
from specledger.records import RequestRecord
from specledger.report.build import build_report
from specledger.rundir import read_records
from tests.fake_server import FakeServer, FakeServerConfig

GATE_NAMES = {"correctness", "quality", "latency", "capacity"}


# ----------------------------------------------------------------------------- pure pieces


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5)), max_size=20))
def test_emission_times_repeat_each_chunk_time_per_token(chunks: list[tuple[float, int]]) -> None:
    times_in = sorted(t for t, _ in chunks)
    counts = [n for _, n in chunks]
    times, sizes = emission_times(times_in, counts)
    assert sum(sizes) == len(times) == sum(counts)
    assert all(s > 0 for s in sizes)
    assert times == sorted(times)
    expected = [t for t, n in zip(times_in, counts) for _ in range(n)]
    assert times == expected


def result(index: int, pid: str, text: str, times=(0.1, 0.2, 0.4), tokens=(1, 2, 3), ok=True) -> RequestResult:
    return RequestResult(
        index=index, ok=ok, prompt_id=pid, chunk_times=list(times), chunk_tokens=list(tokens),
        output_text=text, finish_reason="length", error=None if ok else "HTTP 500: boom",
    )


def test_records_from_probe_maps_timings_ids_and_quality(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(
        json.dumps({"id": "m1", "prompt": "2+2?", "category": "math", "reference": "4"}) + "\n\n"
        + json.dumps({"prompt": "hello"}) + "\n"
    )
    wl = workload_from_jsonl(path)
    assert [it.id for it in wl.items] == ["m1", "w/3"] and wl.category_of("w/3") == "custom"
    results = [
        result(0, "m1", "The answer is 4"),
        result(1, "w/3", "hi", times=(0.3, 0.5), tokens=(0, 2)),
        result(2, "m1", "", ok=False),
    ]
    recs = records_from_probe(
        results, drafter="eagle3", gamma=3, temperature=0.0, model="m", endpoint="http://x",
        category_of=wl.category_of, score_of=wl.score_of,
    )
    assert [r.prompt_id for r in recs] == ["m1", "w/3"]  # the failed request is left out
    first, second = recs
    assert first.category == "math" and first.drafter == "eagle3" and first.gamma == 3
    assert first.token_times == [0.1, 0.2, 0.2, 0.4, 0.4, 0.4] and first.chunks == [1, 2, 3]
    assert first.ttft == 0.1 and first.total_time == 0.4 and first.output_tokens == 6
    assert first.rounds == [] and first.token_ids == [] and first.extra["text_only"] is True
    assert first.extra["quality"] == 1.0 and first.extra["endpoint"] == "http://x"
    assert second.chunks == [2] and second.ttft == 0.5 and "quality" not in second.extra
    base = records_from_probe(
        results[:1], drafter="none", gamma="ignored", temperature=0.0, model="m", endpoint="http://y",
        category_of=wl.category_of, tokenizer=lambda text: [ord(c) for c in text],
    )
    assert base[0].gamma == 0 and base[0].token_ids == [ord(c) for c in "The answer is 4"]
    assert base[0].extra["text_only"] is False
    again = RequestRecord.from_dict(json.loads(first.to_json()))
    assert again == first


def text_record(pid: str, text: str, drafter: str, ids: list[int] | None = None) -> RequestRecord:
    return RequestRecord(
        request_id=f"{drafter}-{pid}", drafter=drafter, gamma=0 if drafter == "none" else 3, temperature=0.0,
        top_p=1.0, top_k=0, seed=0, prompt_tokens=0, output_tokens=1, text=text, token_ids=ids or [],
        stop_reason="length", t_prefill=0.0, ttft=0.1, total_time=0.1, token_times=[0.1], chunks=[1],
        prompt_id=pid, extra={"text_only": ids is None},
    )


def test_greedy_correctness_compares_texts_for_text_only_records() -> None:
    base = [text_record("a", "same text", "none"), text_record("b", "abc", "none")]
    same = greedy_correctness([text_record("a", "same text", "x"), text_record("b", "abc", "x")], base)
    assert same.status == PASS and "text-identical" in same.evidence
    differ = greedy_correctness([text_record("a", "same text", "x"), text_record("b", "abd", "x")], base)
    assert differ.status == FAIL and "prompt b at character 2" in differ.evidence
    tokens = greedy_correctness([text_record("a", "t", "x", ids=[1, 2])], [text_record("a", "t", "none", ids=[1, 3])])
    assert tokens.status == FAIL and "at token 1" in tokens.evidence


def test_labels_gamma_and_acceptance_ledger() -> None:
    assert check_label(" eagle3 ") == "eagle3"
    for bad in ("none", "", "a|b"):
        with pytest.raises(SpecLedgerError, match="--label"):
            check_label(bad)
    assert gamma_label({"per_position_rates": [0.5, 0.2]}) == 2
    assert gamma_label(None) == "server" and gamma_label(None, "4") == 4 and gamma_label({}, "tree") == "tree"
    ledger = acceptance_ledger({"per_position_rates": [0.8, 0.4, 0.1], "mean_acceptance_length": 2.3})
    assert ledger["conditional_a"] == pytest.approx([0.8, 0.5, 0.25])
    assert (ledger["el_from_per_position"] == pytest.approx(2.3)
            and ledger["mean_accepted_per_draft"] == pytest.approx(1.3))
    broken = acceptance_ledger({"per_position_rates": [0.2, 0.5]})
    assert broken["error"] and broken["el_from_per_position"] is None
    assert acceptance_ledger(None)["per_position_rates"] == []


def test_workload_errors_and_new_run_dir(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": 1, "prompt": "a"}\n{"id": "1", "prompt": "b"}\n')
    with pytest.raises(SpecLedgerError, match="appears twice"):
        workload_from_jsonl(path)
    assert [it.id for it in workload_from_prompts(["x", "y"]).items] == ["builtin/0", "builtin/1"]
    check_new_run_dir(tmp_path)
    (tmp_path / "traces.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(SpecLedgerError, match="new --out"):
        check_new_run_dir(tmp_path)


# ----------------------------------------------------------------------------- end to end


def probe_args(url: str, baseline: str, out: Path, *extra: str) -> list[str]:
    return ["probe", url, "--baseline", baseline, "--out", str(out), "--requests", "8", "--concurrency", "2",
            "--max-tokens", "8", *extra]


def gates_of(summary: dict) -> dict[str, str]:
    (scenario,) = summary["scenarios"]
    assert set(scenario["gates"]) == GATE_NAMES
    return {name: g["status"] for name, g in scenario["gates"].items()}


def test_probe_out_with_baseline_is_a_run_with_speedup_and_gates(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"id": f"s{i}", "prompt": f"story {i}", "category": "summary", "reference": "t10 t11 t12"}) + "\n"
        for i in range(4)
    ))
    out = tmp_path / "run"
    config = FakeServerConfig(delays_s=(0.001,))
    with FakeServer(config) as spec, FakeServer(config) as base:
        res = CliRunner().invoke(
            cli_app, probe_args(spec.url, base.url, out, "--label", "eagle3", "--workload", str(workload))
        )
    assert res.exit_code == 0, res.output
    # run's answer line for the category, at the load it was measured (the tables: --verbose)
    assert "answer at load 2" in res.output and "\n  summary " in res.output and "report.html" in res.output
    verdict = json.loads((out / "summary.json").read_text())["verdicts"][0]
    assert verdict["load"] == 2 and verdict["simulated"] is False  # measured at --concurrency 2, not "load 1"
    records = list(read_records(out / "traces.jsonl"))
    assert sorted({(r.drafter, r.gamma) for r in records}) == [("eagle3", 3), ("none", 0)]  # γ from /metrics
    assert {r.prompt_id for r in records} == {"s0", "s1", "s2", "s3"} and len(records) == 16
    meta = json.loads((out / "run.json").read_text())
    assert meta["kind"] == "probe" and set(meta["endpoints"]) == {"endpoint", "baseline"}
    spec_meta = meta["endpoints"]["endpoint"]
    assert spec_meta["spec_decode"]["source"] == "vllm" and spec_meta["spec_decode_counters"]["after"]["num_drafts"] > 0
    assert any("server-wide" in w for w in spec_meta["spec_decode"]["warnings"])
    assert (out / "probe.json").is_file()

    summary, html = build_report(out)  # what `specledger report DIR` does
    (scenario,) = summary["scenarios"]
    assert scenario["drafter"] == "eagle3" and scenario["paired_prompts"] == 4
    assert scenario["speedup"] > 0 and None not in scenario["speedup_ci"]
    gates = gates_of(summary)
    assert gates["correctness"] == PASS and gates["latency"] == PASS and gates["quality"] == PASS
    assert gates["capacity"] in (PASS, FAIL)
    assert "text-identical" in scenario["gates"]["correctness"]["evidence"]
    assert scenario["rounds"]["rounds"] == 0 and scenario["rounds"]["el_full"] is None
    page = html.read_text()
    assert 'id="endpoint"' in page and "server-wide" in page and "eagle3" in page
    assert summary["experiments"]["probe"]["endpoints"][0]["acceptance_ledger"]["gamma"] == 3


def test_probe_correctness_fails_when_the_baseline_says_something_else(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with FakeServer(FakeServerConfig(delays_s=(0.001,))) as spec, \
            FakeServer(FakeServerConfig(delays_s=(0.001,), response_tokens=5)) as base:
        res = CliRunner().invoke(cli_app, probe_args(spec.url, base.url, out, "--gamma", "tree", "--json"))
    assert res.exit_code == 0, res.output
    json.loads(res.output)  # --json prints only JSON
    summary = json.loads((out / "summary.json").read_text())
    (scenario,) = summary["scenarios"]
    assert scenario["gamma"] == "tree" and scenario["speedup"] is not None
    assert gates_of(summary)["correctness"] == FAIL
    (verdict,) = summary["verdicts"]
    assert verdict["decision"] == "off" and "correctness" in verdict["reason"]
    again = CliRunner().invoke(cli_app, probe_args(spec.url, base.url, out))
    assert again.exit_code != 0  # an existing run folder is never appended to


def test_probe_of_specledger_serve_tiny_model_endpoints(tmp_path: Path) -> None:
    """Our own server with a tiny model: ngram speculation vs plain decoding, greedy outputs identical."""
    import torch

    from specledger.serve.runner import ServerThread
    from tests.test_serve import PROMPTS, tiny_app

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:3])))
    out = tmp_path / "run"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ServerThread(tiny_app(drafter="ngram", gamma=4)) as spec, ServerThread(tiny_app(drafter="none")) as base:
            res = CliRunner().invoke(cli_app, probe_args(spec.url, base.url, out, "--workload", str(workload),
                                                         "--requests", "3", "--concurrency", "1"))
    finally:
        torch.set_num_threads(previous)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    (scenario,) = summary["scenarios"]
    assert scenario["drafter"] == "endpoint" and scenario["paired_prompts"] == 3
    assert gates_of(summary)["correctness"] == PASS


def test_import_vllm_bench_out_renders_its_section(tmp_path: Path) -> None:
    bench = {
        "date": "20250101-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": 200, "request_rate": "inf", "max_concurrency": 16, "duration": 41.2, "completed": 200,
        "failed": 0, "total_input_tokens": 44000, "total_output_tokens": 25600, "request_throughput": 4.85,
        "output_throughput": 621.4, "total_token_throughput": 1689.3,
        "mean_ttft_ms": 85.1, "median_ttft_ms": 70.3, "std_ttft_ms": 20.0, "p99_ttft_ms": 190.4,
        "mean_tpot_ms": 21.0, "median_tpot_ms": 20.4, "std_tpot_ms": 3.0, "p99_tpot_ms": 30.2,
        "mean_itl_ms": 45.5, "median_itl_ms": 40.1, "std_itl_ms": 9.0, "p99_itl_ms": 98.7, "p95_itl_ms": 80.0,
        "mean_e2el_ms": 2800.0, "median_e2el_ms": 2700.0, "std_e2el_ms": 300.0, "p99_e2el_ms": 3500.0,
        "spec_decode_acceptance_rate": 46.7, "spec_decode_acceptance_length": 2.4,
        "spec_decode_num_drafts": 10000, "spec_decode_draft_tokens": 30000, "spec_decode_accepted_tokens": 14000,
        "spec_decode_per_position_acceptance_rates": [0.7, 0.45, 0.25],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    out = tmp_path / "imported"
    res = CliRunner().invoke(cli_app, ["import-vllm-bench", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "run.json").read_text())["kind"] == "vllm-bench"
    ledger = json.loads((out / "vllm_bench.json").read_text())["acceptance_ledger"]
    assert ledger["conditional_a"] == pytest.approx([0.7, 0.45 / 0.7, 0.25 / 0.45])
    assert ledger["el_from_per_position"] == pytest.approx(2.4) and ledger["el_reported"] == 2.4
    report = CliRunner().invoke(cli_app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    assert "endpoint figures" in report.output
    page = (out / "report.html").read_text()
    assert 'id="vllm-bench"' in page and "vLLM bench import" in page and "621.4" in page
    assert "no round-level ledger" in page and "0.643" in page  # a_2 = 0.45 / 0.7
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenarios"] == [] and summary["experiments"]["vllm_bench"]["summary"]["requests_ok"] == 200
