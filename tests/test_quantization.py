"""The quantization four-way on a tiny engine: interleaved records, correctness against the verifying
target, the four-way arithmetic, traces kept out of the main analysis, and the report section."""

from __future__ import annotations

import json

import pytest

from specledger.bench.quantization import (
    QUANT_EXPERIMENT,
    SETTINGS,
    identical,
    int8_engine,
    run_quantization,
)
from specledger.engine.decode import Engine
from specledger.engine.int8 import Int8Linear
from specledger.errors import SpecLedgerError
from specledger.records import RequestRecord
from specledger.report.build import build_report
from specledger.report.summary import summarize
from specledger.rundir import read_records
from specledger.workloads import load_jsonl
from tests.conftest import CharLoaded, CharTokenizer, tiny_model


def tiny_engine(seed: int = 2) -> Engine:
    engine = Engine(tiny_model(seed), tokenizer=CharTokenizer(), max_context=512, name="tiny", dtype="float32")
    engine.loaded = CharLoaded()
    return engine


def workload_items(tmp_path):
    path = tmp_path / "w.jsonl"
    rows = [
        {"id": "a", "prompt": "abcabcabcabc abcabc", "category": "copy"},
        {"id": "b", "prompt": "hello hello hello", "category": "chat"},
        {"id": "m", "prompt": "what is 2 plus 3. 2 plus 3 is 5. 2 plus 3 is", "category": "math", "reference": "5"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items, warnings = load_jsonl(str(path))
    assert not warnings
    return items


@pytest.fixture(scope="module")
def quant_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quant")
    engine = tiny_engine()
    result = run_quantization(engine, workload_items(tmp), drafter="ngram", gamma=3, max_tokens=20,
                              out_dir=tmp / "run", n_resamples=100)
    return tmp / "run", result


def _tps(records):
    return sum(r.output_tokens for r in records) / sum(r.total_time for r in records)


def test_int8_engine_shares_everything_but_the_weights():
    engine = tiny_engine()
    q = int8_engine(engine)
    assert isinstance(q.model.lm_head, Int8Linear) and not isinstance(engine.model.lm_head, Int8Linear)
    assert q.tokenizer is engine.tokenizer and q.loaded is engine.loaded
    assert q.eos_token_ids == engine.eos_token_ids and q.max_context == engine.max_context
    assert q.dtype == "float32+int8"


def test_records_are_interleaved_tagged_and_complete(quant_run):
    run_dir, result = quant_run
    records = list(read_records(run_dir / "traces.jsonl"))
    keys = [key for key, *_ in SETTINGS]
    assert len(records) == 3 * len(keys)
    # per prompt, the four settings back to back
    assert [r.extra["setting"] for r in records] == keys * 3
    assert [r.prompt_id for r in records] == [p for p in ("a", "b", "m") for _ in keys]
    for r in records:
        assert r.extra["experiment"] == QUANT_EXPERIMENT
        target = dict((k, t) for k, _, t, _ in SETTINGS)[r.extra["setting"]]
        assert r.extra["target"] == target
        assert r.dtype == ("float32+int8" if target == "int8" else "float32")
        assert (r.drafter == "none") == r.extra["setting"].endswith("plain")
    assert result["prompts"] == ["a", "b", "m"]


def test_correctness_is_judged_against_the_verifying_target(quant_run):
    run_dir, result = quant_run
    records = list(read_records(run_dir / "traces.jsonl"))
    by = {k: [r for r in records if r.extra["setting"] == k] for k, *_ in SETTINGS}
    for r_spec, r_plain in zip(by["fp32-spec"], by["fp32-plain"]):
        assert r_spec.token_ids == r_plain.token_ids
    for r_spec, r_plain in zip(by["int8-spec"], by["int8-plain"]):
        assert r_spec.token_ids == r_plain.token_ids
    c = result["correctness"]
    assert c["spec_fp32_vs_fp32_plain"] == {"identical": 3, "of": 3, "all_identical": True, "differing_prompts": []}
    assert c["spec_int8_vs_int8_plain"]["all_identical"]
    changed = sum(a.token_ids != b.token_ids for a, b in zip(by["int8-plain"], by["fp32-plain"]))
    assert result["int8_output_vs_fp32"]["identical"] == 3 - changed


def test_four_way_arithmetic_comes_from_the_traces(quant_run):
    run_dir, result = quant_run
    records = list(read_records(run_dir / "traces.jsonl"))
    tps = {k: _tps([r for r in records if r.extra["setting"] == k]) for k, *_ in SETTINGS}
    fw = result["four_way"]
    assert fw["quant_speedup"] == pytest.approx(tps["int8-plain"] / tps["fp32-plain"])
    assert fw["spec_speedup"] == pytest.approx(tps["fp32-spec"] / tps["fp32-plain"])
    assert fw["combined_speedup"] == pytest.approx(tps["int8-spec"] / tps["fp32-plain"])
    assert fw["product_of_single_speedups"] == pytest.approx(fw["quant_speedup"] * fw["spec_speedup"])
    assert fw["interaction"] == pytest.approx(fw["combined_speedup"] / fw["product_of_single_speedups"])
    assert fw["spec_speedup_on_quantized"] == pytest.approx(tps["int8-spec"] / tps["int8-plain"])
    rows = {r["key"]: r for r in result["settings"]}
    assert rows["fp32-plain"]["speedup"] == pytest.approx(1.0)
    assert rows["int8-spec"]["speedup"] == pytest.approx(fw["combined_speedup"])
    assert rows["fp32-spec"]["tokens_per_s"] == pytest.approx(tps["fp32-spec"])
    lo, hi = rows["int8-spec"]["speedup_ci"]
    assert lo <= rows["int8-spec"]["speedup"] <= hi
    assert f"{fw['combined_speedup']:.3f}" in result["statements"][0]


def test_quality_of_int8_is_reported_separately(quant_run):
    run_dir, result = quant_run
    records = list(read_records(run_dir / "traces.jsonl"))
    math_scores = {r.extra["setting"]: r.extra["quality"] for r in records if r.prompt_id == "m"}
    q = result["quality_int8_vs_fp32"]
    assert q["n_pairs"] == 1 and q["n_unscored"] == 2  # only the math item has a metric
    assert q["base_mean"] == math_scores["fp32-plain"] and q["spec_mean"] == math_scores["int8-plain"]
    assert "Quantization effect on quality" in result["statements"][-1]


def test_experiment_records_stay_out_of_the_main_analysis(quant_run):
    run_dir, _ = quant_run
    records = list(read_records(run_dir / "traces.jsonl"))
    summary = summarize(records, n_resamples=20)
    assert summary["scenarios"] == [] and summary["baselines"] == []
    assert summary["experiment_requests"] == len(records) and summary["requests"] == 0
    # a main-run record next to them is analysed alone
    main = RequestRecord.from_dict({**json.loads(records[0].to_json()), "extra": {}})
    summary = summarize([*records, main], n_resamples=20)
    assert [b["totals"]["requests"] for b in summary["baselines"]] == [1]


def test_report_renders_the_quantization_section(quant_run, tmp_path):
    run_dir, result = quant_run
    summary, html_path = build_report(run_dir, n_resamples=20)
    html = html_path.read_text(encoding="utf-8")
    assert summary["experiments"]["quantization"]["four_way"] == result["four_way"]
    assert 'id="quantization-table"' in html and 'id="plot-quantization"' in html
    assert "product of single speed-ups" in html and "Quantization effect on quality" in html
    assert 'id="policies-table"' not in html  # only sections whose JSON exists
    assert 'id="gates-table"' not in html  # no main run in this directory


def test_second_run_into_the_same_directory_is_refused(quant_run):
    run_dir, _ = quant_run
    with pytest.raises(SpecLedgerError, match="already holds"):
        run_quantization(tiny_engine(), [], out_dir=run_dir)


def test_quant_self_is_allowed_and_flagged(tmp_path):
    items = workload_items(tmp_path)[:1]
    result = run_quantization(tiny_engine(), items, drafter="quant-self", gamma=2, max_tokens=8,
                              out_dir=tmp_path / "qs", n_resamples=20)
    assert "quant-self" in result["drafter_note"]
    assert "the target itself" in result["drafter_note"]
    assert result["correctness"]["spec_int8_vs_int8_plain"]["all_identical"]
    rows = {r["key"]: r for r in result["settings"]}
    # on the int8 target the quant-self draft is the target: every candidate is accepted
    assert rows["int8-spec"]["acceptance_rate"] == pytest.approx(1.0)


def test_bad_arguments_are_user_errors(tmp_path):
    with pytest.raises(SpecLedgerError, match="gamma"):
        run_quantization(tiny_engine(), workload_items(tmp_path), gamma=0, out_dir=tmp_path / "x")
    with pytest.raises(SpecLedgerError, match="needs a drafter"):
        run_quantization(tiny_engine(), workload_items(tmp_path), drafter="none", out_dir=tmp_path / "x")


def test_identical_pairs_by_prompt_not_by_position():
    def rec(pid, ids):
        return RequestRecord(pid, "none", 0, 0.0, 1.0, 0, 0, 1, len(ids), "", ids, "length", 0.0, 0.0, 1.0,
                             [], [], prompt_id=pid)

    ref = [rec("a", [1, 2]), rec("b", [3])]
    assert identical([rec("b", [3]), rec("a", [1, 2])], ref)["all_identical"]
    out = identical([rec("a", [1, 9]), rec("b", [3]), rec("z", [0])], ref)
    assert (out["identical"], out["of"], out["differing_prompts"]) == (1, 2, ["a"])


def test_each_target_speculates_with_its_best_candidate_picked_on_other_prompts(tmp_path):
    path = tmp_path / "w.jsonl"
    rows = [{"id": f"{c}{i}", "prompt": p * 3, "category": c}
            for c, p in (("copy", "abcabc abc "), ("chat", "hello there ")) for i in range(2)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items, _ = load_jsonl(str(path))
    cands = [("ngram", 2), ("suffix", 3)]
    result = run_quantization(tiny_engine(), items, candidates=cands, max_tokens=12, out_dir=tmp_path / "run",
                              n_resamples=20)
    sel = result["selection"]
    assert result["prompts"] == ["copy0", "chat0"] and sel["prompts"] == ["copy1", "chat1"]  # disjoint halves
    records = list(read_records(tmp_path / "run" / "traces.jsonl"))
    for target in ("fp32", "int8"):
        picked = [r for r in records if r.extra["setting"] == f"select-{target}"]
        assert {r.prompt_id for r in picked} == {"copy1", "chat1"} and len(picked) == 4
        tps = {}
        for d, g in cands:
            mine = [r for r in picked if (r.extra["drafter"], r.extra["gamma"]) == (d, g)]
            tps[(d, g)] = sum(r.output_tokens for r in mine) / sum(r.total_time for r in mine)
        best = max(cands, key=lambda c: tps[c])
        assert result["drafters"][target] == {"drafter": best[0], "gamma": best[1], "label": f"{best[0]} γ={best[1]}"}
        spec = [r for r in records if r.extra["setting"] == f"{target}-spec"]
        assert {(r.drafter, r.gamma) for r in spec} == {(best[0], best[1])}
        assert f"{best[0]} γ={best[1]}" in {r["key"]: r for r in result["settings"]}[f"{target}-spec"]["setting"]
    assert "held apart" in result["statements"][0]
    assert result["correctness"]["spec_int8_vs_int8_plain"]["all_identical"]
