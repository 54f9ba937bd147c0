"""A run directory's report carries the leave-one-γ-out check and the run's cost model."""

from __future__ import annotations

import json

from test_predict import synthetic_run

from specledger.cost.costmodel import CostModel
from specledger.report.build import build_report
from specledger.rundir import TRACE_NAME, append_records


def test_report_has_prediction_check_and_cost_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    append_records(run / TRACE_NAME, synthetic_run(gammas=(2, 4), n_prompts=4))
    summary, html = build_report(run, n_resamples=50)
    pc = summary["prediction_check"]
    assert {"median_abs_error", "p90_abs_error", "rows"} <= set(pc)
    assert {(r["category"], r["gamma"]) for r in pc["rows"]} == {("chat", 2), ("chat", 4), ("copy", 2), ("copy", 4)}
    assert json.loads((run / "summary.json").read_text())["prediction_check"]["median_abs_error"] is not None
    cost = CostModel.load(run / "cost_model.json")
    assert cost.round_s(5, 100) >= cost.round_s(1, 100)
    assert 'id="prediction-table"' in html.read_text()


def test_report_without_two_gammas_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    append_records(run / TRACE_NAME, synthetic_run(gammas=(4,), n_prompts=2))
    summary, _ = build_report(run, n_resamples=50)
    assert summary["prediction_check"]["rows"] == []
    assert "nothing to hold out" in summary["prediction_check"]["note"]
