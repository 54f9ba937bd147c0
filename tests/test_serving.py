"""Serving sweep on a tiny model: curves have every point, speed-ups are relative to plain at the
same load, crossovers and the memory ledger are computed."""

from __future__ import annotations

import json

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import specledger.engine.build as engine_build
from specledger.bench.deploy import batch_size_ranges, best_overall, deploy_configs, deploy_table
from specledger.bench.serving import run_point, run_serving_sweep
from specledger.bench.serving_memory import memory_ledger
from specledger.bench.serving_metrics import crossover
from specledger.cli.sweep import sweep
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.gates.engine_configs import (
    validate_llama_cpp,
    validate_sglang,
    validate_trtllm,
    validate_vllm,
)
from specledger.load_points import poisson_arrivals
from specledger.records import setting_label
from specledger.rundir import read_records
from tests.conftest import CharTokenizer, tiny_model


def test_sweep_points_and_crossover(target):
    engine = Engine(target)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7], [9, 9, 8, 9, 9, 8]]
    res = run_serving_sweep(engine, prompts, [("ngram", 3)], concurrencies=(1, 4), max_tokens=12, rates=(200.0,))
    conc = res["concurrency"]
    assert [(p["load"], p["drafter"]) for p in conc] == [(1, "none"), (1, "ngram"), (4, "none"), (4, "ngram")]
    for p in conc:
        assert p["requests"] == max(2 * p["load"], 4) and p["throughput_tok_s"] > 0
        assert p["ttft_ms"]["p50"] is not None
    assert all(p["speedup"] == 1.0 for p in conc if p["drafter"] == "none")
    assert conc[3]["mean_batch"] > conc[1]["mean_batch"]
    assert "ngram γ=3" in res["crossover"]["concurrency"]
    assert len(res["rate"]) == 2 and "memory" in conc[1]


def test_crossover_and_arrivals():
    pts = [{"load": 1, "speedup": 1.4}, {"load": 8, "speedup": 0.9}, {"load": 4, "speedup": 1.1}]
    assert crossover(pts) == 8
    assert crossover(pts[:1]) is None
    a = poisson_arrivals(10.0, 200, seed=1)
    assert a == sorted(a) and 15 < a[-1] < 25


def test_memory_ledger_matches_prediction_when_drafts_are_full(target):
    engine = Engine(target)
    prompts = [[1, 2, 3, 4, 5]] * 4
    _, m = run_point(target, prompts, lambda: make_drafter("layerskip", engine, layers="1"), 3, 10, concurrency=4)
    led = memory_ledger(target, 4, 3, m["peak_candidate_tokens"], 64)
    assert led["m_kv_bytes_per_token"] == 3 * 2 * 2 * 8 * 4  # layers x (k,v) x kv heads x head_dim x fp32
    assert abs(led["relative_difference"]) <= 0.05  # a model drafter always proposes gamma


# ----------------------------------------------------------------------------- deploy tables
def _pt(kind, load, drafter, gamma, tp, speedup):
    return {"kind": kind, "load": load, "drafter": drafter, "gamma": gamma, "throughput_tok_s": tp,
            "speedup": speedup, "setting": setting_label(drafter, gamma)}


def _synthetic_result():
    conc = []
    for load, ng, sf in ((1, 1.5, 1.1), (4, 1.1, 1.2), (16, 0.8, 0.85)):
        base = 100.0 * load
        conc += [_pt("concurrency", load, "none", 0, base, 1.0), _pt("concurrency", load, "ngram", 4, base * ng, ng),
                 _pt("concurrency", load, "suffix", 4, base * sf, sf)]
    ctx = [_pt("context", 512, "none", 0, 50.0, 1.0), _pt("context", 512, "ngram", 4, 45.0, 0.9)]
    res = {"concurrency": conc, "rate": [], "context": ctx, "crossover": {}}
    res["crossover"]["concurrency"] = {"ngram γ=4": 16, "suffix γ=4": 16}
    return res


def test_deploy_table_picks_the_fastest_setting_or_off():
    rows = deploy_table(_synthetic_result())
    assert [(r["kind"], r["load"], r["setting"]) for r in rows] == [
        ("concurrency", 1, "ngram γ=4"), ("concurrency", 4, "suffix γ=4"), ("concurrency", 16, "off"),
        ("context", 512, "off")]
    assert rows[2]["best_candidate"] == "suffix γ=4" and rows[2]["gamma"] == 0
    assert rows[3]["throughput_tok_s"] == 50.0  # off: plain's throughput


def test_best_drafter_schedule_and_engine_configs():
    res = _synthetic_result()
    assert best_overall(res["concurrency"]) == ("ngram", 4)  # geometric mean 1.097 vs suffix 1.039
    d = deploy_configs(res)
    assert d["best_drafter"] == "ngram" and d["gamma_by_concurrency"] == {1: 4, 4: 4, 16: 0}
    cfg = d["vllm"]["speculative_config"]
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 1024, 0]]
    validate_vllm(cfg)
    validate_trtllm(d["trtllm"])
    assert d["trtllm"]["speculative_config"]["draft_len_schedule"] == {1: 4, 4: 4}
    validate_sglang(d["sglang"])
    validate_llama_cpp(d["llama_cpp"])
    assert d["sglang"][d["sglang"].index("--max-running-requests") + 1] == "4"
    assert "from a concurrency of 16" in d["sglang_note"]
    never = deploy_configs({"concurrency": [_pt("concurrency", 1, "none", 0, 10.0, 1.0),
                                            _pt("concurrency", 1, "ngram", 2, 9.0, 0.9)]})
    assert never["vllm"]["speculative_config"] is None and "launch without it" in never["sglang_note"]
    assert never["trtllm"] is None and never["sglang"] is None and never["llama_cpp"] is None


@given(st.dictionaries(st.integers(1, 256), st.integers(0, 8), min_size=1, max_size=8))
def test_batch_size_ranges_cover_every_batch_once(schedule):
    ranges = batch_size_ranges(schedule)
    assert ranges[0][0] == 1
    for (a0, a1, _), (b0, _, _) in zip(ranges, ranges[1:]):
        assert a0 <= a1 and b0 == a1 + 1  # contiguous, no overlap
    for c, k in schedule.items():  # each measured batch size gets its own measured K
        assert next(r[2] for r in ranges if r[0] <= c <= r[1]) == k
    assert ranges[-1][2] == 0  # beyond the largest measured load: plain
    if any(schedule.values()):  # what vLLM's own schedule check accepts
        validate_vllm({"method": "ngram", "num_speculative_tokens": max(schedule.values()),
                       "num_speculative_tokens_per_batch_size": ranges})


# ----------------------------------------------------------------------------- the sweep verb
class _LenientTokenizer(CharTokenizer):
    def encode(self, text: str) -> list[int]:
        return [self.ALPHABET.index(c) for c in text if c in self.ALPHABET]


class _Loaded:
    tokenizer = _LenientTokenizer()

    def encode_prompt(self, prompt=None, messages=None, chat=True):
        return self.tokenizer.encode(prompt if prompt is not None else " ".join(m["content"] for m in messages))


def _engine():
    e = Engine(tiny_model(2), tokenizer=CharTokenizer(), max_context=512, name="tiny", dtype="float32")
    e.loaded = _Loaded()
    return e


def _app():
    app = typer.Typer()
    app.command("sweep")(sweep)
    app.command("noop")(lambda: None)
    return app


def test_sweep_serving_writes_traces_json_deploy_table_and_report(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_build, "build_engine", lambda target, dtype="auto": _engine())
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"id": "a", "prompt": "abcabcabc abcabc abc", "category": "copy"}) + "\n"
                  + json.dumps({"id": "b", "prompt": "hello hello", "category": "chat"}) + "\n")
    out = tmp_path / "sweep"
    args = ["sweep", "--experiment", "serving", "--workload", str(wl), "--concurrencies", "1,3", "--contexts", "64",
            "--serving-drafters", "ngram:3,suffix:2", "--serving-max-tokens", "10", "--out", str(out),
            "--resamples", "20", "--repeats", "2"]
    result = CliRunner().invoke(_app(), args, env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert not (out / "quantization.json").exists() and not (out / "policies.json").exists()
    doc = json.loads((out / "serving.json").read_text())
    assert doc["drafters"] == ["ngram γ=3", "suffix γ=2"]
    assert [(r["kind"], r["load"]) for r in doc["deploy_table"]] == [("concurrency", 1), ("concurrency", 3),
                                                                      ("context", 64)]
    for row in doc["deploy_table"]:
        pts = [p for p in doc[row["kind"]] if p["load"] == row["load"] and p["drafter"] != "none"]
        best = max(pts, key=lambda p: p["throughput_tok_s"])
        assert row["best_candidate"] == best["setting"]
        assert (row["decision"] == "deploy") == (best["speedup"] > 1.0 and best["speedup_ci"][0] > 1.0)
        assert row["speedup_ci"] == best["speedup_ci"] and len(best["repeats"]) == 2
    assert doc["repeats"] == 2
    assert set(doc["deploy"]["gamma_by_concurrency"]) == {"1", "3"}
    ctx = doc["context"]
    assert len(ctx) == 3 and all(p["requests"] == 2 * 4 for p in ctx)
    records = list(read_records(out / "traces.jsonl"))
    assert all(r.extra["experiment"] == "serving" for r in records)
    assert len(records) == sum(p["requests"] for k in ("concurrency", "context") for p in doc[k])
    assert len({r.request_id for r in records}) == len(records)
    assert {r.prompt_id for r in records if r.extra["kind"] == "concurrency"} == {"a", "b"}
    plain = {r.prompt_id: r.token_ids for r in records if r.drafter == "none" and r.extra["kind"] == "concurrency"}
    assert all(r.token_ids == plain[r.prompt_id] for r in records if r.extra["kind"] == "concurrency")  # greedy exact
    html = (out / "report.html").read_text(encoding="utf-8")
    for div in ("plot-serving-throughput", "plot-serving-speedup", "plot-serving-tpot", "plot-serving-itl",
                "plot-serving-context"):
        assert f'id="{div}"' in html
    assert 'id="serving-deploy-table"' in html and 'id="plot-serving-rate"' not in html
    assert "serving under load" in result.output and "deploy table" in result.output
    assert "memory ledger" in result.output and "crossover (concurrency)" in result.output


def test_sweep_serving_rejects_bad_options(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_build, "build_engine", lambda target, dtype="auto": _engine())
    base = ["sweep", "--experiment", "serving", "--out", str(tmp_path / "x")]
    for extra, message in ((["--serving-drafters", "nope:4"], "unknown drafter"),
                           (["--serving-drafters", "ngram:x"], "drafter:gamma"),
                           (["--concurrencies", "0,2"], "--concurrencies"),
                           (["--contexts", "100000"], "--contexts")):
        bad = CliRunner().invoke(_app(), base + extra)
        assert bad.exit_code != 0 and message in str(bad.exception), (extra, bad.exception)


def test_policies_run_under_load_beside_static_gammas(target):
    """A policy name in place of gamma: one policy per request, choosing gamma every step (batch-aware)."""
    from specledger.bench.sweep import parse_drafter_gammas

    settings = parse_drafter_gammas("ngram:2,ngram:goodput,ngram:batch")
    assert settings == [("ngram", 2), ("ngram", "goodput"), ("ngram", "batch")]
    res = run_serving_sweep(Engine(target), [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]], settings,
                            concurrencies=(1, 4), max_tokens=10)
    labels = {p["setting"] for p in res["concurrency"]}
    assert {"ngram γ=goodput", "ngram γ=batch", "ngram γ=2", "plain"} <= labels
    assert all("memory" not in p for p in res["concurrency"] if isinstance(p["gamma"], str))


def test_repeats_pool_points_and_give_intervals(target):
    engine = Engine(target)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7]]
    res = run_serving_sweep(engine, prompts, [("ngram", 2), ("ngram", "goodput")], concurrencies=(2,),
                            max_tokens=8, repeats=3, warmup=False)
    pts = res["concurrency"]
    assert [p["setting"] for p in pts] == ["plain", "ngram γ=2", "ngram γ=goodput"]
    for p in pts:
        assert len(p["repeats"]) == 3 and p["requests"] == 3 * 4
        assert p["tokens"] == sum(r["tokens"] for r in p["repeats"])
        assert abs(p["throughput_tok_s"] - p["tokens"] / p["wall_s"]) < 1e-9
        assert len(p["speedup_repeats"]) == 3
        low, high = p["speedup_ci"]
        assert low <= high
    (row,) = res["policy_vs_static"]
    assert row["policy"] == "ngram γ=goodput" and row["best_static"] in ("plain", "ngram γ=2")
    assert row["repeats"] == 3 and row["ci"][0] <= row["ci"][1]
    assert row["at_least_as_good"] == (row["ratio"] >= 1 or row["ci"][1] >= 1)


def test_log_ratio_interval_covers_the_ratio():
    from specledger.analysis.stats import log_ratio_t_interval

    lo, hi = log_ratio_t_interval([1.1, 1.2, 1.15, 1.18])
    assert 1.05 < lo < 1.15 < hi < 1.25
    assert all(map(lambda x: x != x, log_ratio_t_interval([1.2])))  # one value: no interval


def test_step_cost_interpolates_and_learns_draft_cost(target):
    from specledger.cost.step_cost import StepCost
    from specledger.engine.policy import GoodputGamma
    from specledger.engine.step_cost import calibrate_step_cost

    c = StepCost.from_points([1, 4, 16], [0.010, 0.012, 0.030])
    assert c.forward_s(1) == 0.010 and abs(c.forward_s(10) - 0.021) < 1e-12 and c.forward_s(32) > 0.030
    noisy = StepCost.from_points([1, 2], [0.02, 0.01])  # never cheaper with more rows: pooled (isotonic)
    assert noisy.forward_s(2) == noisy.forward_s(1) == pytest.approx(0.015)
    assert c.pricer.surface.lookup(32).source == "extrapolated"  # the one cost type prices and labels it
    c.observe_draft(4, 0.004)
    assert abs(c.step_s(2, 3) - (c.forward_s(8) + 2 * 3 * 0.001)) < 1e-12
    assert c.fresh().draft_s_per_candidate() == 0.0
    # a batched goodput policy speculates when rows are cheap and stops when each row costs a full step
    cheap = GoodputGamma(step_cost=StepCost.from_points([1, 512], [0.010, 0.0101]))
    costly = GoodputGamma(step_cost=StepCost.from_points([1, 512], [0.010, 5.12]))
    for p in (cheap, costly):
        p.reset()
        for _ in range(10):
            p.observe(4, 3)
    assert cheap.choose(0, 16) >= 4 and costly.choose(0, 16) in (0, 1)
    cal = calibrate_step_cost(target, rows=(1, 4, 8), context=8, slots=4, repeats=1)
    assert cal.pricer.surface.rows_axis == (1, 4, 8) and 0 < cal.forward_s(1) <= cal.forward_s(4) <= cal.forward_s(8)


def test_run_full_side_experiments_write_all_three_and_resume_skips_them(tmp_path, monkeypatch):
    import specledger.bench.sweep as sweep_lib

    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"id": "a", "prompt": "abcabcabc abcabc abc", "category": "copy"}) + "\n"
                  + json.dumps({"id": "b", "prompt": "hello hello", "category": "chat"}) + "\n")
    real = sweep_lib.load_sweep_items
    monkeypatch.setattr(sweep_lib, "load_sweep_items",
                        lambda cats, n, seed, workload, vocab: real(cats, n, seed, wl, vocab))
    small = {"max_tokens": 6, "static_gammas": [2], "policies": ["goodput"], "concurrencies": [1, 2],
             "serving_drafters": "ngram:2,ngram:goodput", "serving_max_tokens": 6, "repeats": 2, "contexts": [64],
             "context_to_limit": False}
    warnings: list[str] = []
    engine = _engine()
    engine.loaded = _SmallVocabLoaded()
    ran = sweep_lib.run_side_experiments(engine, tmp_path, 0, None, warnings.append, small)
    assert ran == ["quant4", "policies", "serving"]
    for name in ("quantization.json", "policies.json", "serving.json"):
        assert (tmp_path / name).exists()
    serving_doc = json.loads((tmp_path / "serving.json").read_text())
    assert serving_doc["repeats"] == 2 and serving_doc["context_lengths"] == [64]
    assert sweep_lib.run_side_experiments(engine, tmp_path, 0, None, warnings.append, small) == []
    (tmp_path / "serving.json").unlink()  # as if interrupted half-way: traces present, JSON missing
    assert sweep_lib.run_side_experiments(engine, tmp_path, 0, None, warnings.append, small) == []
    assert any("interrupted 'serving'" in w for w in warnings)


class _SmallVocabLoaded(_Loaded):
    def encode_prompt(self, prompt=None, messages=None, chat=True):
        return [i % 64 for i in super().encode_prompt(prompt, messages, chat)]  # the tiny model's vocabulary


def test_context_grid_over_sources_and_concurrencies(tmp_path):
    engine = _engine()
    engine.loaded = _SmallVocabLoaded()
    res = run_serving_sweep(engine, [[1, 2, 3, 1, 2, 3]], [("ngram", 2)], concurrencies=(1,), max_tokens=6,
                            context_lengths=(96,), context_concurrencies=(1, 2),
                            context_sources=("xsum", "agent", "padding"), warmup=False)
    ctx = res["context"]
    assert {(p["source"], p["concurrency"]) for p in ctx} == {(s, c) for s in ("xsum", "agent", "padding")
                                                              for c in (1, 2)}
    assert all(p["requests"] == 2 for p in ctx)  # max(c, 2) long prompts per point
    rows = res["context_crossover"]
    assert [(r["source"], r["length"]) for r in rows] == [("agent", 96), ("padding", 96), ("xsum", 96)]
    assert all(set(r["speedup_by_concurrency"]) == {"1", "2"} for r in rows)
    table = deploy_table(res)
    assert len([r for r in table if r["kind"] == "context"]) == 6  # one decision per (source, c, length)


def test_long_context_sources_reach_the_length_and_padding_is_repetitive():
    from specledger.bench.long_context import long_context_prompts

    loaded = _Loaded()
    for source in ("xsum", "agent", "padding"):
        (ids,) = long_context_prompts(loaded, 300, 1, source=source)
        assert 240 <= len(ids) <= 420, (source, len(ids))
    (long,) = long_context_prompts(loaded, 12000, 1, source="xsum")  # more than a handful of articles
    assert len(long) >= 11000
    (pad,) = long_context_prompts(loaded, 300, 1, source="padding")
    text = "".join(loaded.tokenizer.ALPHABET[i] for i in pad)
    assert text.count("grass") >= 2


def test_memory_ledger_counts_draft_weights_and_draft_kv(target):
    engine = Engine(target)
    prompts = [[1, 2, 3, 4, 5]] * 4
    _, ls = run_point(target, prompts, lambda: make_drafter("layerskip", engine, layers="1"), 3, 10, concurrency=4)
    led = memory_ledger(target, 4, 3, ls["peak_candidate_tokens"], 64, draft=ls["draft_memory"])
    assert led["draft_weight_bytes"] == 0  # layer-skip runs the target's own weights
    per_token = 1 * 2 * 2 * 8 * 4  # one layer x (k,v) x kv heads x head_dim x fp32
    assert ls["draft_memory"]["kv_bytes_per_token"] == per_token
    assert led["predicted_draft_kv_bytes"] == 4 * (15 + 3 + 1) * per_token  # context 5 + 10, gamma 3
    assert led["engine_draft_kv_bytes"] >= led["predicted_draft_kv_bytes"]  # static cache, every layer, rounded up
    _, qs = run_point(target, prompts, lambda: make_drafter("quant-self", engine), 3, 10, concurrency=4)
    assert qs["draft_memory"]["weight_bytes"] > 0  # its own int8 copy of the weights
    _, ng = run_point(target, prompts, lambda: make_drafter("ngram", engine), 3, 10, concurrency=4)
    assert ng["draft_memory"] == {"weight_bytes": 0, "kv_bytes_per_request_max": 0, "kv_bytes_per_token": 0,
                                  "max_context_tokens": 15}


def test_deploy_printout_keeps_bracketed_text():
    from rich.console import Console

    from specledger.report.console_experiments import print_deploy_table

    res = _synthetic_result()
    console = Console(record=True, width=300)
    print_deploy_table({"deploy_table": deploy_table(res), "deploy": deploy_configs(res)}, console)
    assert "[start_bs, end_bs, K]" in console.export_text()  # not swallowed as console markup


def test_interleave_categories_mixes_every_prefix():
    from types import SimpleNamespace

    from specledger.bench.serving import interleave_categories

    ps = [SimpleNamespace(category=c, id=f"{c}{i}") for c, n in (("code", 3), ("chat", 2)) for i in range(n)]
    assert [p.id for p in interleave_categories(ps)] == ["code0", "chat0", "code1", "chat1", "code2"]
