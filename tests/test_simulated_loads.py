"""Simulated loads in the main job (``run --simulate-loads``): a synthetic run's solo chains and load points,
the simulator at loads beyond them, its validation at the measured load, the gates and verdicts labelled
simulated, and the schedule that marks them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from specledger.errors import SpecLedgerError
from specledger.gates import FAIL, NOT_ASSESSED, SLO
from specledger.mainjob.job import RunPlan
from specledger.records import RequestRecord
from specledger.report.build import build_report
from specledger.report.console import print_summary
from specledger.rundir import append_records, write_json_atomic
from tests.synthetic import plain_rounds, request_from_rounds, spec_rounds

#: 4 prompts per category: the fewest from which the decisions' confidence sequence can exclude anything
PROMPTS = {"copy": ["c0", "c1", "c2", "c3"], "chat": ["h0", "h1", "h2", "h3"]}
ACCEPTED = {"copy": [4, 4, 4, 4], "chat": [1] * 10}  # 20 tokens each: copy drafts well, chat half as well


def solo_records(broken: str | None = None) -> list[RequestRecord]:
    """Plain and ngram γ=4 on every prompt, solo; ``broken``: a prompt whose speculative output differs."""
    out = []
    for cat, pids in PROMPTS.items():
        for i, pid in enumerate(pids):
            scale = 1 + 0.05 * i
            out.append(request_from_rounds(f"{pid}|none", pid, plain_rounds(20, 0.02 * scale), category=cat,
                                           t_prefill=0.01))
            ids = [7] * 20 if pid == broken else None
            out.append(request_from_rounds(f"{pid}|ngram", pid, spec_rounds("ngram", 4, ACCEPTED[cat], 0.001,
                                                                            0.021 * scale), category=cat,
                                           t_prefill=0.01, token_ids=ids))
    return out


def load_point(solo: list[RequestRecord], load: int, slow: float) -> list[RequestRecord]:
    """The solo requests re-timed as a batched load point (every time × ``slow``), tagged like bench.loads."""
    out = []
    for setting, drafter in (("plain", "none"), ("ngram γ=4", "ngram")):
        recs = [r for r in solo if r.drafter == drafter]
        wall = sum(r.total_time * slow for r in recs) / load
        for i, r in enumerate(recs):
            out.append(dataclasses.replace(
                r, request_id=f"load{load}|{setting}|T0|{i}", ttft=r.ttft * slow, total_time=r.total_time * slow,
                token_times=[t * slow for t in r.token_times], rounds=[],
                extra={"experiment": "load", "kind": "concurrency", "load": load, "setting": setting,
                       "point_wall_s": wall, "point_cpu_s": 1.0, "point_tokens": 20 * len(solo) // 2,
                       "point_requests": len(solo) // 2}))
    return out


def make_run(tmp_path: Path, records: list[RequestRecord], simulate: list[int]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    append_records(run / "traces.jsonl", records)
    write_json_atomic(run / "run.json", {"name": "synthetic", "config": {"simulate_loads": simulate},
                                         "kv_bytes_per_token": 1024, "memory_total_bytes": 2**30})
    return run


def test_simulated_loads_are_verdicts_labelled_simulated_with_the_validation_error(tmp_path: Path) -> None:
    solo = solo_records(broken="h1")
    run = make_run(tmp_path, solo + load_point(solo, 4, 1.3), [8, 64])
    summary, html = build_report(run, n_resamples=50)
    assert summary["loads"] == [1, 4] and summary["simulated_loads"] == [8, 64]
    sim = [v for v in summary["verdicts"] if v["simulated"]]
    assert {(v["category"], v["load"]) for v in sim} == {(c, x) for c in PROMPTS for x in (8, 64)}
    assert all(v["simulated"] is False for v in summary["verdicts"] if v["load"] in (1, 4))
    for v in sim:
        err = v["simulation_error"]
        assert err["validated_at"] == [4] and "speed-up ±" in err["text"] and "Simulated at load" in v["reason"]
    by = {(v["category"], v["load"]): v for v in sim}
    # priced by the solo rounds, a batch of 64 verifies 5 rows per request: speculation stops paying there
    assert by[("copy", 8)]["decision"] == "deploy" and by[("copy", 8)]["speedup"] > 1.5
    assert by[("copy", 64)]["decision"] == "off" and by[("chat", 8)]["decision"] == "off"

    doc = summary["simulation"]
    assert {row["load"] for row in doc["validation"]} == {4} and doc["requests"] <= 3000
    assert "solo rounds" in doc["cost_source"]
    row = next(r for r in doc["validation"] if r["setting"] == "ngram γ=4")
    assert row["speedup"]["real"] > 1 and row["speedup"]["error"] is not None

    scen = {(s["category"], s["load"]): s for s in summary["load_scenarios"] if s.get("simulated")}
    copy = scen[("copy", 8)]
    lo, hi = copy["speedup_ci"]
    blo, bhi = copy["speedup_bootstrap_ci"]
    assert lo <= blo and hi >= bhi  # the interval is widened by the simulator's error
    assert copy["gates"]["correctness"]["status"] == NOT_ASSESSED
    assert "simulated" in copy["gates"]["correctness"]["evidence"] and "passed at measured loads 1, 4" in \
        copy["gates"]["correctness"]["evidence"]
    assert "simulated goodput" in copy["gates"]["capacity"]["evidence"] and "KV fits" in \
        copy["gates"]["capacity"]["evidence"]
    assert copy["gates"]["latency"]["evidence"].startswith("simulated: TTFT P99")
    # a setting that failed correctness at a measured load fails it at the simulated ones too
    assert scen[("chat", 64)]["gates"]["correctness"]["status"] == FAIL

    sched = {s["category"]: s for s in summary["schedules"]}
    assert sched["copy"]["text"] == ("ngram γ=4 at 1–4 and 8 (sim), off from 64 (sim) (between 8 and 64, not "
                                     "located within 2×: configs switch at 9)")
    assert sched["copy"]["vllm"]["num_speculative_tokens_per_batch_size"] == \
        [[1, 8, 4], [9, 1024, 0]]
    page = html.read_text()
    assert 'id="simulated-loads"' in page and "(simulated)" in page
    console = Console(record=True, width=200)
    print_summary(summary, console)
    text = console.export_text()
    assert "copy T=0 load 64 (simulated)" in text and "simulated 8, 64, marked (sim)" in text

    # the SLO's target load may be a simulated one; a load neither measured nor simulated is an error
    (tmp_path / "slo.json").write_text(json.dumps({"target_load": 64}))
    again, _ = build_report(run, tmp_path / "slo.json", n_resamples=20)
    assert all(s["at_target"]["load"] == 64 and s["at_target"]["simulated"] for s in again["schedules"])
    (tmp_path / "slo.json").write_text(json.dumps({"target_load": 32}))
    with pytest.raises(SpecLedgerError, match="or simulated \\(loads 8, 64\\)"):
        build_report(run, tmp_path / "slo.json", n_resamples=20)
    # an SLO nobody meets: the simulated verdicts say that plain decoding misses it too
    (tmp_path / "slo.json").write_text(json.dumps({"ttft_p99_ms": 1}))
    tight, _ = build_report(run, tmp_path / "slo.json", n_resamples=20)
    assert all("SLO out of reach at load 64 even without speculation" in v["reason"]
               and v["slo_out_of_reach"].startswith("SLO out of reach at load 64")
               for v in tight["verdicts"] if v["simulated"] and v["load"] == 64)


def test_without_a_measured_load_the_simulation_is_not_validated(tmp_path: Path) -> None:
    run = make_run(tmp_path, solo_records(), [32])
    summary, _ = build_report(run, n_resamples=20)
    sim = [v for v in summary["verdicts"] if v["simulated"]]
    assert {v["load"] for v in sim} == {32} and summary["simulation"]["validation"] == []
    for v in sim:  # no interval without the simulator's error: never "deploy"
        assert v["simulation_error"]["text"] == "not validated" and v["decision"] == "off"
        assert "not validated" in v["reason"] and v["resolved"] is False


def test_simulated_capacity_says_what_it_cannot_assess_and_plan_errors() -> None:
    import numpy as np

    from specledger.gates.simulated import carried_gate, sim_capacity_gate
    from specledger.simulate.run_loads import SimPoint

    def point(drafter: str, seconds: float) -> SimPoint:
        n = 4
        return SimPoint(0.0, 16, drafter, 4 if drafter != "none" else 0, ["a"] * n, np.full(n, 20.0),
                        np.full(n, seconds), np.full(n, 0.05), np.full(n, 0.01), np.full(n, 0.02), seconds * 2,
                        5.0, 5.0, 0, 0, 1)

    mask = np.ones(4, dtype=bool)
    fast, plain = point("ngram", 0.2), point("none", 0.4)
    assert sim_capacity_gate(fast, plain, mask, mask, [], {}, SLO()).status == "pass"
    res = sim_capacity_gate(fast, plain, mask, mask, [], {}, SLO(max_cpu_s_per_1k_tokens=5))
    assert res.status == NOT_ASSESSED and "CPU cost not assessed (simulated" in res.evidence
    assert sim_capacity_gate(plain, fast, mask, mask, [], {}, SLO(max_cpu_s_per_1k_tokens=5)).status == FAIL
    assert carried_gate("quality", []).status == NOT_ASSESSED
    with pytest.raises(SpecLedgerError, match="measured too"):
        RunPlan(loads=[1, 16], simulate_loads=[16, 64]).validate()
    with pytest.raises(SpecLedgerError, match="--simulate-loads"):
        RunPlan(simulate_loads=[0]).validate()


def test_report_verb_chooses_the_simulated_loads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specledger.cli import app as cli_app

    solo = solo_records()
    run = make_run(tmp_path, solo + load_point(solo, 4, 1.3), [64])
    res = CliRunner().invoke(cli_app, ["report", str(run), "--simulate-loads", "8", "--resamples", "20"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "summary.json").read_text())["simulated_loads"] == [8]
    res = CliRunner().invoke(cli_app, ["report", str(run), "--simulate-loads", "none", "--resamples", "20"])
    summary = json.loads((run / "summary.json").read_text())
    assert res.exit_code == 0 and summary["simulated_loads"] == [] and summary["simulation"] is None
    assert not any(v["simulated"] for v in summary["verdicts"])


def test_a_run_without_speculative_rounds_is_not_simulated(tmp_path: Path) -> None:
    run = make_run(tmp_path, [r for r in solo_records() if r.drafter == "none"], [64])
    summary, _ = build_report(run, n_resamples=20)
    assert summary["simulated_loads"] == [] and summary["simulation"]["note"].startswith("not simulated")
    (tmp_path / "slo.json").write_text(json.dumps({"target_load": 64}))
    with pytest.raises(SpecLedgerError, match="target_load 64 was not measured"):
        build_report(run, tmp_path / "slo.json", n_resamples=20)
