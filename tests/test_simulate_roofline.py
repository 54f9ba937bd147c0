"""The roofline with a draft model: drafting priced as the draft model's steps, memory shared."""

from __future__ import annotations

import json
from pathlib import Path

from specledger.simulate.hardware import model_config_from_dict, roofline
from specledger.simulate.profile import load_cost
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
