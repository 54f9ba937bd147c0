"""`specledger predict` and `specledger calibrate`: JSON keys, clear errors, a tiny-model calibration."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_model
from test_predict import synthetic_run
from typer.testing import CliRunner

from specledger.cli import app, main
from specledger.cost.costmodel import CostModel
from specledger.engine.calibrate import calibrate
from specledger.rundir import META_NAME, TRACE_NAME, append_records, write_json_atomic


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    append_records(d / TRACE_NAME, synthetic_run(gammas=(2, 4), n_prompts=4))
    write_json_atomic(d / META_NAME, {"config": {"max_tokens": 80}})
    return d


def test_predict_json_lists_every_category(run_dir):
    res = CliRunner().invoke(app, ["predict", str(run_dir), "--drafter", "ngram", "--gamma", "8", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["category"] for r in rows} == {"chat", "copy"}
    for r in rows:
        assert {"category", "drafter", "gamma", "predicted_speedup", "predicted_tokens_per_s", "interval"} <= set(r)
        assert r["drafter"] == "ngram" and r["gamma"] == 8
        assert r["interval"][0] <= r["predicted_speedup"] <= r["interval"][1]
        assert "beyond" in r["assumption"]
    # a longer output budget: requests cut by length run on, so more tokens are predicted
    res2 = CliRunner().invoke(app, ["predict", str(run_dir), "--drafter", "ngram", "--gamma", "8", "--json",
                                    "--max-tokens", "200"])
    assert res2.exit_code == 0, res2.output


def test_predict_table_states_the_assumption(run_dir):
    res = CliRunner().invoke(app, ["predict", str(run_dir), "--drafter", "ngram", "--gamma", "3"])
    assert res.exit_code == 0, res.output
    assert "assumption" in res.output and "copy" in res.output


@pytest.mark.parametrize("args, message", [
    (["--drafter", "layerskip", "--gamma", "4"], "no measured requests of drafter"),
    (["--drafter", "ngram", "--gamma", "0"], "--gamma must be >= 1"),
    (["--drafter", "ngram", "--gamma", "4", "--categories", "nope"], "unknown categories"),
])
def test_predict_errors_are_one_line(run_dir, args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["predict", str(run_dir), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_predict_needs_a_run_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["predict", str(tmp_path), "--drafter", "ngram", "--gamma", "4"])
    assert exc.value.code == 2 and "traces.jsonl" in capsys.readouterr().err


def test_calibrate_on_a_tiny_model_is_monotone_and_round_trips(tmp_path):
    cost = calibrate(model=tiny_model(max_seq_len=256), contexts=(16, 64, 160), repeats=1)
    assert cost.source.startswith("calibrated on")
    for ctx in (0, 64, 200):
        times = [cost.round_s(r, ctx) for r in range(1, 18)]
        assert all(b >= a for a, b in zip(times, times[1:]))
    assert cost.step_s(12, 4, 64) >= cost.step_s(4, 4, 64)
    assert cost.prefill_s(128) >= cost.prefill_s(16) > 0
    assert set(cost.meta["points"]) >= {"solo", "batched", "prefill"}
    cost.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json").round_s(5, 64) == pytest.approx(cost.round_s(5, 64))


def test_calibrate_rejects_a_missing_device(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--device", "tpu"])
    assert exc.value.code == 2 and "--device" in capsys.readouterr().err


def test_predict_with_a_calibrated_cost_model_takes_missing_parts_from_the_run(run_dir, tmp_path):
    cal = calibrate(model=tiny_model(max_seq_len=256), contexts=(16, 64), repeats=1)
    cal.save(tmp_path / "cal.json")
    res = CliRunner().invoke(app, ["predict", str(run_dir), "--drafter", "ngram", "--gamma", "4", "--json",
                                   "--cost", str(tmp_path / "cal.json")])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert rows and all("calibrated on" in r["cost_source"] and "fitted from" in r["cost_source"] for r in rows)
