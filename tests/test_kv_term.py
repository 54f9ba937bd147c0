"""The KV term (issue 48): bytes read per step = weights + B · context · m_KV, one formula for every bandwidth
line, the capacity gate's candidate KV by tree nodes, and the ledger's KV bytes per step."""

from __future__ import annotations

import pytest
from conftest import tiny_model

from specledger.engine import bandwidth
from specledger.ledger.memory import SMOLLM2_135M, KVShape, candidate_tokens, kv_read_bytes, step_read_bytes
from specledger.records import RequestRecord, RoundRecord

# SmolLM2-135M with a float32 KV (the default CPU target): 30 layers × 2 × 3 KV heads × 64 × 4 B
M_KV_F32 = KVShape(layers=30, kv_heads=3, head_dim=64, bytes_per_element=4).bytes_per_token


# ---------------------------------------------------------------------------------- the one formula
def test_step_read_is_weights_plus_the_kv_of_every_request_context():
    assert M_KV_F32 == 46_080  # the issue's ~46 KB a token
    assert kv_read_bytes(M_KV_F32, 4096) == 4096 * 46_080  # ~189 MB a step at 4k: more than ~100 MB of Q4_1 weights
    assert step_read_bytes(100e6, M_KV_F32, 4096) == 100e6 + 4096 * 46_080
    assert step_read_bytes(100e6, M_KV_F32, 4096, batch=8) == 100e6 + 8 * 4096 * 46_080  # weights once, KV per request
    assert step_read_bytes(100e6, M_KV_F32, 0) == 100e6 and kv_read_bytes(M_KV_F32, -5) == 0.0
    with pytest.raises(Exception, match="negative"):
        kv_read_bytes(-1, 10)


def test_candidate_slots_are_tree_nodes_not_depth():
    assert candidate_tokens(4) == 4 and candidate_tokens(0) == 0
    assert candidate_tokens(3, tree_budget=12) == 12  # a depth-3 tree of 12 nodes writes 12 KV slots


def test_m_kv_has_one_formula():
    from specledger.bench.serving_memory import model_kv_shape

    model = tiny_model()
    cfg = model.config
    assert cfg.kv_bytes_per_token(2) == KVShape(cfg.n_layers, cfg.n_kv_heads, int(cfg.head_dim), 2).bytes_per_token
    assert model_kv_shape(model).bytes_per_token == bandwidth.kv_bytes_per_position(model)
    assert model_kv_shape(model, [0]).bytes_per_token * cfg.n_layers == bandwidth.kv_bytes_per_position(model)


# ---------------------------------------------------------------------------------- the bandwidth line
def test_decode_bytes_and_line_count_kv_at_the_context():
    model = tiny_model()
    m_kv, w = bandwidth.kv_bytes_per_position(model), model.weight_bytes()
    assert bandwidth.decode_bytes_per_token(model, 300) == step_read_bytes(w, m_kv, 300) == w + 300 * m_kv
    line = bandwidth.decode_line(model, 300, 10.0, None)
    per_token = (w + 300 * m_kv) / 1e6
    assert line == (f"{per_token * 10 / 1e3:.1f} GB/s achieved ({per_token:.0f} MB/token = {w / 1e6:.0f} MB weights "
                    f"+ {300 * m_kv / 1e6:.0f} MB KV at context 300, x 10.0 tok/s)")
    assert bandwidth.describe(290e6, 10.0, 29e9, 190e6, 4096) == (
        "2.9 GB/s achieved (290 MB/token = 100 MB weights + 190 MB KV at context 4096, x 10.0 tok/s) "
        "= 10% of 29.0 GB/s measured read")
    # the mean decode context of (prompt, output) pairs, weighted by decode steps
    assert bandwidth.requests_decode_context([(10, 5), (100, 1)]) == 12.0  # the second has no decode step
    assert bandwidth.requests_decode_context([]) == 0.0
    assert bandwidth.request_bytes_per_token(model, [(10, 5)]) == bandwidth.decode_bytes_per_token(model, 12.0)


def _plain(prompt: int, out: int, step_s: float = 0.01) -> RequestRecord:
    rounds = [RoundRecord("none", 0, 0, 0, 1, False, 0.0, step_s, 0.0, prompt + i) for i in range(out - 1)]
    return RequestRecord(
        request_id="p|none", drafter="none", gamma=0, temperature=0.0, top_p=1.0, top_k=0, seed=0,
        prompt_tokens=prompt, output_tokens=out, text="x", token_ids=list(range(out)), stop_reason="length",
        t_prefill=0.01, ttft=0.01, total_time=0.01 + step_s * (out - 1), token_times=[0.01] * out, chunks=[1] * out,
        rounds=rounds)


def test_run_and_generate_bandwidth_figures_count_kv_at_the_measured_context(monkeypatch):
    """run.json's ``bandwidth`` and generate's line both come from plain_decode_bandwidth: weights + the KV of
    the plain requests' mean decode context."""
    monkeypatch.setattr(bandwidth, "measure_read_bandwidth", lambda **_: 20e9)
    model = tiny_model()
    recs = [_plain(1000, 21), _plain(3000, 41)]  # mean decode contexts 1010 and 3020, 20 and 40 steps
    ctx = (20 * 1010 + 40 * 3020) / 60
    fig = bandwidth.plain_decode_bandwidth(model, recs)
    m_kv = bandwidth.kv_bytes_per_position(model)
    assert fig["mean_context"] == pytest.approx(ctx)
    assert fig["kv_read_bytes_per_token"] == pytest.approx(ctx * m_kv)
    assert fig["bytes_per_token"] == pytest.approx(model.weight_bytes() + ctx * m_kv)
    assert fig["plain_decode_tokens_per_s"] == pytest.approx(100.0)
    assert fig["bandwidth"] == bandwidth.decode_line(model, ctx, 100.0, 20e9) and f"KV at context {ctx:.0f}" in \
        fig["bandwidth"]

    from specledger.mainjob import generate

    class _Engine:
        device = "cpu"

    eng = _Engine()
    eng.model = model
    shown = generate.bandwidth(eng, recs[0])
    assert "KV at context 1010" in shown["bandwidth"] and "kv_read_bytes_per_token" not in shown


# ---------------------------------------------------------------------------------- the capacity gate
def _load_rec(gamma: int, tree_budget: int = 0, prompt: int = 4000) -> RequestRecord:
    return RequestRecord(
        request_id="a|ngram", drafter="ngram", gamma=gamma, temperature=0.0, top_p=1.0, top_k=0, seed=0,
        prompt_tokens=prompt, output_tokens=96, text="x", token_ids=list(range(96)), stop_reason="length",
        t_prefill=0.1, ttft=0.1, total_time=1.0, token_times=[0.1] * 96, chunks=[1] * 96, rounds=[],
        tree_budget=tree_budget, extra={"experiment": "load", "load": 4})


def test_capacity_counts_a_trees_candidate_kv_by_nodes_at_long_context():
    from specledger.gates.capacity import kv_capacity
    from specledger.gates.slo import SLO

    meta = {"kv_bytes_per_token": M_KV_F32, "memory_total_bytes": 2**30, "weight_bytes": 0}
    slo = SLO(max_memory_mb=906)  # 950 MB: five requests of 4,096 tokens' KV and a chain's 4 candidates fit
    budget = 906 * 2**20
    chain, chain_text = kv_capacity([_load_rec(4)], 4, meta, slo)
    tree, tree_text = kv_capacity([_load_rec(4, tree_budget=64)], 4, meta, slo)  # depth 4, 64 nodes
    assert chain == budget // (4096 * M_KV_F32 + 4 * M_KV_F32) == 5 and "γ·m_KV 180.0 KiB" in chain_text
    assert tree == budget // (4096 * M_KV_F32 + 64 * M_KV_F32) == 4 and "64 tree nodes·m_KV 2880.0 KiB" in tree_text


# ---------------------------------------------------------------------------------- the ledger
def _ledger(args: list[str], capsys) -> dict:
    from tests.test_ledger_cli import ledger_json

    return ledger_json(args, capsys)


def test_ledger_reports_the_kv_read_per_step_at_a_context(capsys):
    from tests.test_ledger_cli import run_ledger

    mem = _ledger(["--kv", "smollm2", "--kv-bytes", "4", "--batch", "2", "--gamma", "4", "--context", "4096",
                   "--weight-bytes", "1e8"], capsys)["memory"]
    read = mem["step_read"]
    assert read["context"] == 4096 and read["kv_read_bytes_per_step"] == 2 * 4096 * M_KV_F32
    assert read["read_bytes_per_step"] == step_read_bytes(1e8, M_KV_F32, 4096, 2)
    assert read["kv_share"] == pytest.approx(2 * 4096 * M_KV_F32 / (1e8 + 2 * 4096 * M_KV_F32))
    no_weights = _ledger(["--kv", "smollm2", "--context", "1024"], capsys)["memory"]["step_read"]
    assert no_weights["kv_read_bytes_per_step"] == 1024 * SMOLLM2_135M.bytes_per_token
    assert no_weights["read_bytes_per_step"] is None
    run_ledger(["--kv", "smollm2", "--kv-bytes", "4", "--context", "4096", "--weight-bytes", "1e8"])
    out = capsys.readouterr().out
    assert "reads B·c·m_KV = 1 × 4096 × 46080 B = 180.0 MiB of KV at context 4096" in out and "KV 65 %" in out


def test_ledger_tree_candidate_kv_counts_nodes(capsys):
    mem = _ledger(["--kv", "smollm2", "--batch", "3", "--gamma", "4", "--tree-budget", "16", "--acceptance", "0.7"],
                  capsys)["memory"]
    assert mem["tree"]["nodes"] == 16 and mem["tree"]["candidate_kv_bytes"] == 3 * 16 * SMOLLM2_135M.bytes_per_token
    assert mem["rows"][0]["candidate_kv_bytes"] == 3 * 4 * SMOLLM2_135M.bytes_per_token


@pytest.mark.parametrize("args, needle", [
    (["--acceptance", "0.8", "--context", "512"], "--context needs --kv"),
    (["--kv", "smollm2", "--weight-bytes", "1e8"], "--weight-bytes needs --context"),
    (["--kv", "smollm2", "--context", "-1"], "must be >= 0"),
])
def test_ledger_context_errors_are_one_line(args, needle, capsys):
    from tests.test_ledger_cli import run_ledger

    with pytest.raises(SystemExit):
        run_ledger(args)
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1

