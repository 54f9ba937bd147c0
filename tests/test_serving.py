"""Serving sweep on a tiny model: curves have every point, speed-ups are relative to plain at the
same load, crossovers and the memory ledger are computed."""

from __future__ import annotations

from specledger.bench.serving import crossover, memory_ledger, poisson_arrivals, run_point, run_serving_sweep  # noqa: F401
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter


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
