"""Loads in the main job (issue 19): load points on a tiny model, kept apart from the solo records,
gates and verdicts per (category, temperature, load), the schedule across loads, the load gates
themselves, and the quality gate that says when outputs were cut."""

from __future__ import annotations

import json

import pytest

from specledger.errors import SpecLedgerError
from specledger.gates import (
    FAIL,
    NOT_ASSESSED,
    PASS,
    SLO,
    kv_capacity,
    load_capacity_gate,
    load_latency_gate,
    quality_gate,
    slo_from_dict,
)
from specledger.gates.load_verdicts import analyze_loads
from specledger.load_points import interleaved, requests_at
from specledger.mainjob.job import RunPlan, run
from specledger.records import LOAD_EXPERIMENT, RequestRecord, main_records
from specledger.report.build import build_report
from specledger.rundir import read_records
from tests.conftest import char_engine


@pytest.fixture()
def engine(target):
    return char_engine(target)


@pytest.fixture()
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [
        {"id": "a", "prompt": "abcabcabcabc def", "category": "copy"},
        {"id": "b", "prompt": "hello hello hello", "category": "chat"},
        {"id": "c", "prompt": "xyzxyzxyz", "category": "copy"},
        {"id": "d", "prompt": "hi there hi there", "category": "chat"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_requests_cycle_prompts_and_mix_categories():
    ids = interleaved(["a", "c", "b", "d"], {"a": "copy", "c": "copy", "b": "chat", "d": "chat"})
    assert ids == ["a", "b", "c", "d"]
    assert requests_at(2, ids) == ids  # at least every prompt once
    assert requests_at(6, ids) == ["a", "b", "c", "d", "a", "b"]  # a closed loop of 6 needs 6 requests


def test_run_with_loads_gates_and_schedule(tmp_path, engine, workload):
    out = tmp_path / "run"
    plan = RunPlan(drafters=["ngram"], gammas=[2, 4], temperatures=[0.0], max_tokens=10,
                   workload_file=str(workload), loads=[1, 2, 6])
    run(out, plan, engine)
    records = list(read_records(out / "traces.jsonl"))
    solo = main_records(records)
    at_load = [r for r in records if r.extra.get("experiment") == LOAD_EXPERIMENT]
    assert len(solo) == 4 * 3  # the solo job is unchanged
    # per load > 1: plain + 2 settings, max(load, 4 prompts) requests each
    assert len(at_load) == 3 * 4 + 3 * 6
    assert {r.extra["load"] for r in at_load} == {2, 6}
    for r in at_load:
        assert r.extra["point_cpu_s"] >= 0 and r.extra["point_wall_s"] > 0 and r.extra["point_tokens"] > 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["kv_bytes_per_token"] > 0

    # resume: the load points already in the trace are not run again
    run(out, plan, engine, resume=True)
    assert len(list(read_records(out / "traces.jsonl"))) == len(records)

    summary, _ = build_report(out, n_resamples=50)
    assert summary["loads"] == [1, 2, 6]
    assert summary["requests"] == len(solo)  # load records stay out of the solo analysis
    by_load = {(v["category"], v["load"]) for v in summary["verdicts"]}
    assert by_load == {(c, x) for c in ("copy", "chat") for x in (1, 2, 6)}
    assert all(v["simulated"] is False for v in summary["verdicts"])
    for s in summary["load_scenarios"]:
        assert s["load"] in (2, 6) and s["speedup"] is not None
        assert s["gates"]["correctness"]["status"] == PASS  # greedy under batching == plain under batching
        assert "TPOT P99" in s["gates"]["latency"]["evidence"]
        assert "goodput" in s["gates"]["capacity"]["evidence"]
        assert "CPU-s per 1k tokens" in s["gates"]["capacity"]["evidence"]
        assert "KV fits" in s["gates"]["capacity"]["evidence"]
    sched = {s["category"]: s for s in summary["schedules"]}
    assert set(sched) == {"copy", "chat"}
    for s in sched.values():
        assert "at" in s["text"]
        if s["vllm"]:  # vLLM's [[start, end, k], ...] ranges, contiguous from 1 past the largest load (6)
            from specledger.gates.engine_configs import validate_vllm

            validate_vllm(s["vllm"])
            ranges = s["vllm"]["num_speculative_tokens_per_batch_size"]
            assert ranges[0][0] == 1 and ranges[-1][1] == 1024 and ranges[-1][2] == 0 and ranges[-1][0] <= 7

    # an SLO whose target load was not measured: a one-line error naming the fix
    (tmp_path / "slo.json").write_text(json.dumps({"target_load": 64}))
    with pytest.raises(SpecLedgerError, match="--loads ...,64"):
        build_report(out, tmp_path / "slo.json", n_resamples=20)
    (tmp_path / "slo.json").write_text(json.dumps({"target_load": 6}))
    summary, _ = build_report(out, tmp_path / "slo.json", n_resamples=20)
    assert all(s["at_target"]["load"] == 6 for s in summary["schedules"])


def test_bad_loads_and_slo():
    with pytest.raises(SpecLedgerError, match="--loads"):
        RunPlan(loads=[0, 4]).validate()
    with pytest.raises(SpecLedgerError, match="max_cpu_s_per_1k_tokens"):
        slo_from_dict({"max_cpu_s_per_1k_tokens": -1})
    with pytest.raises(SpecLedgerError, match="tpot_p99_ms"):
        slo_from_dict({"tpot_p99_ms": float("nan")})


def _rec(pid: str, drafter: str, gamma: int, *, ttft: float = 0.01, total: float = 0.2, tokens: int = 10,
         wall: float = 1.0, cpu: float = 2.0, point_tokens: int = 100, extra: dict | None = None,
         text: str = "x", stop: str = "eos") -> RequestRecord:
    times = [ttft + i * (total - ttft) / max(tokens - 1, 1) for i in range(tokens)]
    return RequestRecord(
        request_id=f"{pid}|{drafter}", drafter=drafter, gamma=gamma, temperature=0.0, top_p=1.0, top_k=0,
        seed=0, prompt_tokens=100, output_tokens=tokens, text=text, token_ids=list(range(tokens)),
        stop_reason=stop, t_prefill=ttft, ttft=ttft, total_time=total, token_times=times,
        chunks=[1] * tokens, rounds=[], category="c", prompt_id=pid, model="m", dtype="f",
        extra={"experiment": "load", "load": 4, "point_wall_s": wall, "point_cpu_s": cpu,
               "point_tokens": point_tokens, **(extra or {})})


def test_load_latency_gate_reads_tpot_p99_and_token_itl():
    ok = {"ttft_ms": {"p99": 100.0}, "tpot_ms": {"p50": 50.0, "p99": 90.0}, "itl_token_ms": {"p99": 80.0},
          "longest_stall_ms": 200.0}
    assert load_latency_gate(ok, SLO()).status == PASS
    slow_tail = {**ok, "tpot_ms": {"p50": 50.0, "p99": 450.0}}
    res = load_latency_gate(slow_tail, SLO())
    assert res.status == FAIL and "TPOT P99 450.0>400" in res.evidence


def test_load_capacity_gate_goodput_kv_and_cpu():
    base = [_rec(p, "none", 0, wall=1.0, cpu=2.0) for p in "ab"]
    fast = [_rec(p, "ngram", 4, wall=0.5, cpu=3.0) for p in "ab"]
    slow = [_rec(p, "ngram", 4, wall=2.0, cpu=3.0) for p in "ab"]
    meta = {"kv_bytes_per_token": 1024, "memory_total_bytes": 2**30, "weight_bytes": 0}
    res = load_capacity_gate(fast, base, 4, 4, meta)
    assert res.status == PASS and "goodput 4.00 req/s (2/2 met the SLO) ≥ plain 2.00" in res.evidence
    assert "30.0 CPU-s per 1k tokens (plain 20.0)" in res.evidence
    assert load_capacity_gate(slow, base, 4, 4, meta).status == FAIL  # fewer good requests per second
    # a request over the TTFT target does not count towards goodput
    late = [_rec("a", "ngram", 4, wall=0.5, ttft=3.0, total=3.5), _rec("b", "ngram", 4, wall=0.5)]
    assert "1/2 met" in load_capacity_gate(late, base, 4, 4, meta).evidence
    # KV: (100 + 10) tokens × 1 KiB + γ·m_KV = 114 KiB per request; a 1 MiB budget fits 8 < load 16
    fits, text = kv_capacity(fast, 4, meta, SLO(max_memory_mb=1))
    assert fits == 8 and "γ·m_KV 4.0 KiB" in text
    res = load_capacity_gate(fast, base, 4, 16, meta, SLO(max_memory_mb=1))
    assert res.status == FAIL and "< load 16" in res.evidence
    # CPU cost judged only against a limit the SLO sets
    assert load_capacity_gate(fast, base, 4, 4, meta, SLO(max_cpu_s_per_1k_tokens=25)).status == FAIL


def test_quality_gate_can_fail_and_says_when_outputs_were_cut():
    base = [_rec(p, "none", 0, extra={"quality": 1.0, "quality_complete": True}) for p in "ab"]
    broken = [_rec(p, "ngram", 4, extra={"quality": 0.0, "quality_complete": True}, text="def f(:")
              for p in "ab"]
    res = quality_gate(broken, base)
    assert res.status == FAIL and "mean score 0.000 vs plain 1.000" in res.evidence
    cut_b = [_rec(p, "none", 0, tokens=40, stop="length", extra={"quality": 0.0, "quality_complete": False})
             for p in "ab"]
    cut_s = [_rec(p, "ngram", 4, tokens=40, stop="length", extra={"quality": 0.0, "quality_complete": False})
             for p in "ab"]
    res = quality_gate(cut_s, cut_b)
    assert res.status == NOT_ASSESSED and res.evidence.startswith("output cut at 40 tokens before an answer")


def test_answer_complete_reads_functions_and_answers():
    from specledger.quality import answer_complete
    from specledger.workloads import WorkloadItem

    code = WorkloadItem(id="c", category="code", messages=None, prompt="def f(x):\n    \"\"\"double\"\"\"\n",
                        reference={"prompt": "def f(x):\n    \"\"\"double\"\"\"\n", "test": "def check(f): pass",
                                   "entry_point": "f"})
    assert answer_complete(code, "```python\ndef f(x):\n    return 2 * x\n```", "length") is True
    assert answer_complete(code, "```python\ndef f(x):\n    return (2 *", "length") is False
    assert answer_complete(code, "anything", "eos") is True
    math_item = WorkloadItem(id="m", category="math", messages=None, prompt="1+1?", reference="2")
    assert answer_complete(math_item, "Let's think. 1 + 1", "length") is False
    assert answer_complete(math_item, "The answer is 2. Then", "length") is True
    summary = WorkloadItem(id="s", category="summary", messages=None, prompt="x", reference="y")
    assert answer_complete(summary, "cut", "length") is None


def test_analyze_loads_ignores_solo_records():
    solo = _rec("a", "none", 0, extra={})
    solo.extra.pop("experiment")
    assert analyze_loads([solo])["verdicts"] == []


def test_load_points_under_sampling(tmp_path, engine, workload):
    out = tmp_path / "run"
    plan = RunPlan(drafters=["ngram"], gammas=[2], temperatures=[0.8], max_tokens=8,
                   workload_file=str(workload), loads=[1, 3])
    run(out, plan, engine)
    summary, _ = build_report(out, n_resamples=20)
    at3 = [s for s in summary["load_scenarios"] if s["load"] == 3]
    assert at3 and all(s["temperature"] == 0.8 for s in at3)
    # one sample per prompt cannot test a sampler: said, never a pass
    assert {s["gates"]["correctness"]["status"] for s in at3} == {NOT_ASSESSED}
