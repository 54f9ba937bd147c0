"""The roofline: its overhead terms (non-negative, monotone, the same floats one step or many at once), and
with a draft model: drafting priced as the draft model's steps, memory shared."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.cost.loader import load_pricer as load_cost
from specledger.cost.roofline import (
    OVERHEADS,
    VLLM_CAPTURE_SIZES,
    Overheads,
    RooflineCost,
    model_config_from_dict,
    roofline,
)
from tests.test_simulate import _cli, _record

TARGET = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
DRAFT = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 8192, "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": True}


def test_draft_model_costs_its_steps_and_its_memory():
    target, draft = model_config_from_dict(TARGET), model_config_from_dict(DRAFT)
    alone, paired = roofline("h100", target), roofline("h100", target, draft_model=draft)
    assert alone.draft_s("model", 4, 500) == alone.model_free_draft_s  # no draft config: model-free price
    one = paired._step(draft, 1, 1, 500)
    assert paired.draft_s("model", 4, 500) == 4 * one  # gamma one-row steps of the draft model
    assert paired.draft_s("ngram", 4, 500) == paired.model_free_draft_s  # other drafters unchanged
    assert 0 < one < paired.step_s(1, 1, 500)  # a 1B draft step is cheaper than an 8B target step
    assert paired.kv_budget_tokens() < alone.kv_budget_tokens()  # its weights and KV share the memory


def test_cli_draft_model_config(tmp_path: Path, capsys):
    recs = [_record(f"p{i}", d, g, rounds) for i in range(4)
            for d, g, rounds in (("none", 0, [(0, 0)] * 20), ("model", 4, [(4, (i + j) % 5) for j in range(10)]))]
    (tmp_path / "traces.jsonl").write_text("".join(r.to_json() + "\n" for r in recs), encoding="utf-8")
    (tmp_path / "t.json").write_text(json.dumps(TARGET))
    (tmp_path / "d.json").write_text(json.dumps(DRAFT))
    base = ["simulate", "--from", str(tmp_path), "--drafter", "model", "--gamma", "4", "--concurrency", "4",
            "--hardware", "h200", "--model-config", str(tmp_path / "t.json"), "--requests", "40", "--json"]
    code, out, err = _cli(base + ["--draft-model-config", str(tmp_path / "d.json"), "--out", str(tmp_path / "sim")],
                          capsys)
    assert code == 0, err
    with_draft = json.loads(out)[1]
    code, out, err = _cli(base, capsys)
    assert code == 0, err
    model_free = json.loads(out)[1]
    assert with_draft["setting"] == "model γ=4"
    assert with_draft["tpot_p50_ms"] > model_free["tpot_p50_ms"]  # drafting with a model costs time
    saved = json.loads((tmp_path / "sim" / "simulate.json").read_text())
    assert "roofline" in saved["cost_source"]
    code, out, err = _cli(["simulate", "--from", str(tmp_path), "--concurrency", "4", "--draft-model-config",
                           str(tmp_path / "d.json")], capsys)
    assert code == 2 and "--hardware" in err and "Traceback" not in err


def test_roofline_profile_round_trips_with_its_draft_model(tmp_path: Path):
    cost = roofline("l4", model_config_from_dict(TARGET), draft_model=model_config_from_dict(DRAFT))
    (tmp_path / "p.json").write_text(json.dumps(cost.to_dict()))
    again = load_cost(tmp_path / "p.json")
    assert again.draft_s("model", 3, 100) == cost.draft_s("model", 3, 100)
    assert again.kv_budget_tokens() == cost.kv_budget_tokens()


# ---------------------------------------------------------------------------------- the overhead terms
def _only(name: str) -> list[Overheads]:
    """The "graphs" overheads one term at a time (the others zero / off)."""
    g = OVERHEADS["graphs"]
    return [Overheads(f"{name}-launch", g.launch_s, g.kernels_per_layer),
            Overheads(f"{name}-multi", g.launch_s, 0, g.multi_row_kernels),
            Overheads(f"{name}-attn", eff_attn=g.eff_attn),
            Overheads(f"{name}-logits", logit_bytes=g.logit_bytes),
            Overheads(f"{name}-row", sample_row_s=g.sample_row_s),
            Overheads(f"{name}-pad", capture_sizes=g.capture_sizes)]


def test_each_overhead_is_non_negative_and_monotone():
    m = model_config_from_dict(TARGET)
    bound = roofline("h200", m, terms="bound")
    grid_rows = [1, 2, 3, 5, 8, 9, 17, 64, 100, 256, 511, 513, 2000]
    for o in [*_only("x"), OVERHEADS["graphs"], OVERHEADS["eager"]]:
        c = RooflineCost(m, bound.hw, overheads=o)
        for b in (1, 4, 64):
            for ctx in (0.0, 512.0, 4096.0):
                extra = [c.step_s(max(r, b), b, ctx) - bound.step_s(max(r, b), b, ctx) for r in grid_rows]
                assert min(extra) >= 0, o.name  # every term only adds
                ts = [c.step_s(max(r, b), b, ctx) for r in grid_rows]
                assert ts == sorted(ts), o.name  # more rows never cost less
            assert c.step_s(64, b, 4096) >= c.step_s(64, b, 512)  # more context never costs less
    g = roofline("h200", m)
    assert g.step_s(5, 4, 512) - g.step_s(4, 4, 512) >= g.terms().multi_row  # one request verifying: the q > 1 path
    assert roofline("h200", m, terms="eager").step_s(1, 1, 0) > g.step_s(1, 1, 0)  # eager launches cost more


def test_padding_rounds_rows_up_to_capture_sizes():
    k = roofline("h200", model_config_from_dict(TARGET)).terms()
    assert k.capture == VLLM_CAPTURE_SIZES
    cases = {1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 250: 256, 511: 512, 512: 512, 513: 513, 4000: 4000}
    assert {r: k.pad(r) for r in cases} == cases
    np.testing.assert_array_equal(k.pads(np.array(list(cases))), list(cases.values()))
    # the matmuls see the padded rows: 3 rows cost what 4 do there (bar the per-row terms)
    per_row = k.kv / k.memory + k.logits / k.memory + k.row_s
    assert k.time(3, 1, 0.0) <= k.time(4, 1, 0.0) <= k.time(3, 1, 0.0) + per_row * 1.0001
    assert roofline("h200", model_config_from_dict(TARGET), terms="bound").terms().pad(3) == 3


def test_bound_is_the_pure_roofline_and_the_source_says_what_it_is():
    m = model_config_from_dict(TARGET)
    b, g = roofline("h200", m, terms="bound"), roofline("h200", m)
    k = b.terms()
    for r, bb, c in [(1, 1, 0.0), (7, 3, 333.3), (1024, 64, 512.0)]:
        pure = max((k.flops_row * r + 4 * m.layers * m.heads * m.head_dim * r * c) / k.compute,
                   (k.weights + bb * c * k.kv + r * k.kv) / k.memory) + k.launch
        assert b.step_s(r, bb, c) == pure
    assert b.source.startswith("roofline lower bound ") and "overheads" not in b.source
    assert g.source.startswith("roofline lower bound + assumed overheads (graphs")


@settings(max_examples=300, deadline=None)
@given(terms=st.sampled_from(["bound", "graphs", "eager"]), batch=st.integers(1, 300),
       extra=st.lists(st.integers(0, 5000), min_size=1, max_size=20),
       ctx=st.lists(st.floats(0, 40000, allow_nan=False), min_size=20, max_size=20))
def test_time_and_times_are_bit_identical(terms, batch, extra, ctx):
    cost = roofline("h100", model_config_from_dict(TARGET), terms=terms, draft_model=model_config_from_dict(DRAFT))
    rows = np.array(extra, dtype=np.int64) + batch
    c = np.array(ctx[:rows.shape[0]])
    for m in (cost.model, cost.draft_model):
        k = cost.terms(m)
        assert k.times(rows, batch, c).tolist() == [k.time(r, batch, x) for r, x in zip(rows.tolist(), c.tolist())]
    assert cost.step_s_many(rows, batch, c).tolist() == [cost.step_s(r, batch, x) for r, x in zip(rows.tolist(),
                                                                                             c.tolist())]


def test_old_roofline_profiles_load_as_the_bound(tmp_path: Path):
    cost = roofline("h200", model_config_from_dict(TARGET))
    d = cost.to_dict()
    (tmp_path / "new.json").write_text(json.dumps(d))
    assert load_cost(tmp_path / "new.json").step_s(40, 8, 900) == cost.step_s(40, 8, 900)
    del d["overheads"]
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert load_cost(tmp_path / "old.json").step_s(40, 8, 900) == roofline("h200", model_config_from_dict(TARGET),
                                                                          terms="bound").step_s(40, 8, 900)


@settings(max_examples=300, deadline=None)
@given(terms=st.sampled_from(["bound", "graphs", "eager"]), batch=st.integers(0, 300),
       rows=st.integers(0, 9000), cand=st.integers(0, 600), ctx=st.floats(0, 40000, allow_nan=False))
def test_fused_step_fns_are_step_prices_forward_to_the_bit(terms, batch, rows, cand, ctx):
    from specledger.simulate.pricing import StepPrices

    prices = StepPrices(roofline("h200", model_config_from_dict(TARGET), terms=terms), "ngram", 256, 0, 0)
    assert prices.forward_one(rows, batch, ctx) == prices.forward(rows, batch, ctx)
    assert prices.forward_two(rows + cand, rows, batch, ctx) == (prices.forward(rows + cand, batch, ctx),
                                                                 prices.forward(rows, batch, ctx))
