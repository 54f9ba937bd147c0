"""Speculation-length policies side by side on a tiny engine: the table, best static γ in hindsight,
goodput vs it, one policy instance per experiment, the report section and the `sweep` verb."""

from __future__ import annotations

import json

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import specledger.engine.build as engine_build
import specledger.engine.policy as policy_module
from specledger.bench.policies import (
    POLICY_EXPERIMENT,
    compare_to_best_static,
    intervals_overlap,
    run_policies,
    setting_name,
)
from specledger.cli.sweep import sweep
from specledger.errors import SpecLedgerError
from specledger.report.build import build_report
from specledger.report.console_experiments import print_experiments
from specledger.rundir import read_records
from tests.test_quantization import tiny_engine, workload_items

STATIC = (1, 2, 4)
POLICIES = ("heuristic", "ema", "goodput")


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pol")
    made = []
    real = policy_module.make_policy

    def counting(spec):
        made.append(spec)
        return real(spec)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policy_module, "make_policy", counting)
        result = run_policies(tiny_engine(), workload_items(tmp), drafter="ngram", static_gammas=STATIC,
                              policies=POLICIES, max_tokens=20, out_dir=tmp / "run", n_resamples=200)
    return tmp / "run", result, made


def test_one_policy_instance_per_experiment(policy_run):
    _, _, made = policy_run
    assert sorted(made) == sorted(POLICIES)  # not one per request: learned costs carry over


def test_records_are_tagged_interleaved_and_reproduce_plain(policy_run):
    run_dir, result, _ = policy_run
    records = list(read_records(run_dir / "traces.jsonl"))
    names = ["plain", *(setting_name(g) for g in STATIC), *POLICIES]
    assert [r.extra["setting"] for r in records] == names * 3
    assert all(r.extra["experiment"] == POLICY_EXPERIMENT for r in records)
    plain = {r.prompt_id: r.token_ids for r in records if r.extra["setting"] == "plain"}
    assert all(r.token_ids == plain[r.prompt_id] for r in records)  # greedy: every policy is exact
    for r in records:
        if r.extra["kind"] == "static":
            assert r.gamma in STATIC and all(rd.gamma <= r.gamma for rd in r.rounds)
        elif r.extra["kind"] == "policy":
            assert r.gamma == r.extra["setting"]
    assert all(row["correctness"] is None or row["correctness"]["all_identical"] for row in result["settings"])


def test_policy_table_fields_come_from_the_traces(policy_run):
    run_dir, result, _ = policy_run
    records = list(read_records(run_dir / "traces.jsonl"))
    rows = {r["setting"]: r for r in result["settings"]}
    assert list(rows) == ["plain", "γ=1", "γ=2", "γ=4", *POLICIES]

    def tps(name):
        recs = [r for r in records if r.extra["setting"] == name]
        return sum(r.output_tokens for r in recs) / sum(r.total_time for r in recs)

    for name, row in rows.items():
        assert row["tokens_per_s"] == pytest.approx(tps(name))
        assert row["speedup"] == pytest.approx(tps(name) / tps("plain"))
        rounds = [rd for r in records if r.extra["setting"] == name for rd in r.rounds]
        assert row["mean_gamma"] == pytest.approx(sum(rd.gamma for rd in rounds) / len(rounds))
        if name != "plain":
            lo, hi = row["speedup_ci"]
            assert lo <= row["speedup"] <= hi
            assert row["el_full"] >= 1.0
    assert rows["plain"]["mean_gamma"] == 0 and rows["plain"]["el_full"] == 1.0


def test_goodput_against_the_best_static_gamma(policy_run):
    _, result, _ = policy_run
    rows = {r["setting"]: r for r in result["settings"]}
    statics = [r for r in result["settings"] if r["kind"] == "static"]
    best = max(statics, key=lambda r: r["speedup"])
    gb = result["goodput_vs_best_static"]
    assert gb["best_static"] == best["setting"] and gb["best_static_speedup"] == best["speedup"]
    assert gb["goodput_speedup"] == rows["goodput"]["speedup"]
    overlap = intervals_overlap(rows["goodput"]["speedup_ci"], best["speedup_ci"])
    assert gb["ci_overlap"] == overlap
    assert gb["goodput_at_least_best_within_noise"] == (rows["goodput"]["speedup"] >= best["speedup"] or overlap)
    assert f"{rows['goodput']['speedup']:.3f}" in gb["statement"] and best["setting"] in gb["statement"]
    assert gb["ratio_to_best_static"] == pytest.approx(rows["goodput"]["tokens_per_s"] / best["tokens_per_s"])
    assert result["goodput_learned"]["cost_line_s"] is not None  # learned over the experiment


def test_compare_to_best_static_decides_by_ci_overlap():
    def row(name, kind, s, lo, hi):
        return {"setting": name, "kind": kind, "gamma": name, "speedup": s, "speedup_ci": [lo, hi]}

    settings = [row("γ=2", "static", 1.5, 1.4, 1.6), row("goodput", "policy", 1.2, 1.1, 1.3)]
    empty = {"goodput": [], "γ=2": []}
    out = compare_to_best_static(settings, empty)
    assert out["ci_overlap"] is False and out["goodput_at_least_best_within_noise"] is False
    assert "slower beyond noise" in out["statement"]
    settings[1] = row("goodput", "policy", 1.45, 1.3, 1.55)
    out = compare_to_best_static(settings, empty)
    assert out["ci_overlap"] and out["goodput_at_least_best_within_noise"] and "within noise" in out["statement"]
    assert compare_to_best_static(settings[:1], empty) is None  # no goodput policy run


interval = st.tuples(st.floats(-10, 10), st.floats(0, 5)).map(lambda t: (t[0], t[0] + t[1]))


@given(interval, interval, st.floats(-10, 15))
def test_intervals_overlap_iff_they_share_a_point(a, b, x):
    overlap = intervals_overlap(a, b)
    assert overlap == intervals_overlap(b, a)
    if a[0] <= x <= a[1] and b[0] <= x <= b[1]:
        assert overlap
    if overlap:
        shared = max(a[0], b[0])
        assert a[0] <= shared <= a[1] and b[0] <= shared <= b[1]


def test_intervals_overlap_with_a_missing_bound_is_unknown():
    assert intervals_overlap([None, 1.0], [0.5, 2.0]) is None


def test_bad_policy_arguments_are_user_errors(tmp_path):
    items = workload_items(tmp_path)
    with pytest.raises(SpecLedgerError, match="unknown policy"):
        run_policies(tiny_engine(), items, policies=("nope",), out_dir=tmp_path / "x")
    with pytest.raises(SpecLedgerError, match="static gammas"):
        run_policies(tiny_engine(), items, static_gammas=(0, 2), out_dir=tmp_path / "x")
    with pytest.raises(SpecLedgerError, match="needs a drafter"):
        run_policies(tiny_engine(), items, drafter="none", out_dir=tmp_path / "x")


def test_report_renders_the_policies_section(policy_run, capsys):
    run_dir, result, _ = policy_run
    summary, html_path = build_report(run_dir, n_resamples=20)
    html = html_path.read_text(encoding="utf-8")
    assert 'id="policies-table"' in html and 'id="plot-policies"' in html
    assert result["goodput_vs_best_static"]["statement"] in html
    assert 'id="quantization-table"' not in html
    from rich.console import Console

    console = Console(width=200, record=True)
    print_experiments(summary, console)
    text = console.export_text()
    assert "speculation-length policies" in text and "goodput" in text and "γ=4" in text


def test_sweep_command_runs_both_experiments_and_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_build, "build_engine", lambda target, dtype="auto": tiny_engine())
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"id": "a", "prompt": "abcabcabc abcabc", "category": "copy"}) + "\n"
                  + json.dumps({"id": "b", "prompt": "hello hello", "category": "chat"}) + "\n")
    app = typer.Typer()
    app.command("sweep")(sweep)
    app.command("noop")(lambda: None)
    out = tmp_path / "sweep"
    args = ["sweep", "--workload", str(wl), "--max-tokens", "10", "--gammas", "1,3", "--policies", "goodput",
            "--gamma", "2", "--out", str(out), "--resamples", "50"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (out / "quantization.json").exists() and (out / "policies.json").exists()
    assert (out / "report.html").exists() and json.loads((out / "run.json").read_text())["kind"] == "sweep"
    assert "quantization four-way" in result.output and "goodput" in result.output
    bad = CliRunner().invoke(app, ["sweep", "--experiment", "nope", "--out", str(tmp_path / "y")])
    assert bad.exit_code != 0 and "unknown --experiment" in str(bad.exception)
