"""The serving simulator: determinism, conservation, reductions, KV pressure, tails, routers, plans, CLI."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import run_cli

from specledger.cost.roofline import ModelConfig, roofline
from specledger.simulate.arrivals import closed_loop, poisson
from specledger.simulate.chains import ChainTable
from specledger.simulate.cluster import SLO, capacity_plan, least_outstanding
from specledger.simulate.dispatch import round_robin
from specledger.simulate.replica import _trim
from specledger.simulate.simulator import break_even_verify_premium, simulate
from specledger.simulate.state import ServerConfig


class LinearCost:
    """step = a + b * rows (+ c * batch * context); prefill = p0 + p1 * tokens; other = o per step."""

    source = "test: linear"

    def __init__(self, a=0.01, b=0.001, c=0.0, p0=0.02, p1=1e-4, o=0.0005, d=0.0):
        self.a, self.b, self.c, self.p0, self.p1, self.o, self.d = a, b, c, p0, p1, o, d

    def step_s(self, rows, batch, context):
        return self.a + self.b * rows + self.c * batch * context

    def round_s(self, rows, context):
        return self.step_s(rows, 1, context)

    def prefill_s(self, n):
        return self.p0 + self.p1 * n

    def draft_s(self, drafter, gamma, context=0.0):
        return self.d * gamma

    def other_s(self, batch=1):
        return self.o


def chains(n=20, seed=0, a=None, out=(30, 60), prompt=(50, 200)):
    rng = np.random.default_rng(seed)
    return [SimpleNamespace(chain=[a if a is not None else float(x) for x in rng.uniform(0.2, 0.95, 4)],
                            fill=[1.0, 1.0, 1.0, 1.0], prompt_tokens=int(rng.integers(*prompt)),
                            output_tokens=int(rng.integers(*out)), category="c", drafter="ngram")
            for _ in range(n)]


def table(**kw):
    return ChainTable.from_chains(chains(**kw), 16)


def test_same_seed_same_result_and_seeds_differ():
    t = table()
    a = simulate(t, closed_loop(4), 100, LinearCost(), 4, seed=1).metrics()
    b = simulate(t, closed_loop(4), 100, LinearCost(), 4, seed=1).metrics()
    c = simulate(t, closed_loop(4), 100, LinearCost(), 4, seed=2).metrics()
    assert a == b
    assert a["throughput_tok_s"] != c["throughput_tok_s"]


def test_conservation_and_closed_loop_littles_law():
    t = table(n=30)
    r = simulate(t, closed_loop(8), 2000, LinearCost(), 4, config=ServerConfig(max_num_seqs=8))
    L, m = r.ledger, r.metrics()
    assert m["requests"] == 2000
    assert np.array_equal(L.out, L.target)  # every request got exactly its tokens
    assert m["tokens"] == int(L.target.sum())
    assert np.all(L.t_first >= L.arrival) and np.all(L.t_last >= L.t_first)
    # Little: in-flight = throughput (req/s) x mean latency = c, up to the drain at the end
    assert m["request_rate_s"] * m["mean_latency_s"] == pytest.approx(8, rel=0.02)


def test_open_loop_stable_rate_is_served():
    t = table()
    arr = poisson(2.0, 400, seed=3)
    m = simulate(t, arr, 400, LinearCost(), 2, config=ServerConfig(max_num_seqs=32)).metrics()
    assert m["requests"] == 400
    assert m["offered_rate_s"] == pytest.approx(2.0, rel=0.15)
    # stable: served as fast as offered; latency stays far below the run length
    assert m["request_rate_s"] == pytest.approx(m["offered_rate_s"], rel=0.1)
    assert m["latency_p99_ms"] < 0.1 * m["wall_s"] * 1e3


def test_gamma_zero_is_plain_batching_and_matches_the_closed_form():
    t = table(n=5)
    plain = ChainTable.plain(t.prompt_tokens, t.output_tokens)
    cost = LinearCost()
    a = simulate(t, closed_loop(3), 40, cost, 0).metrics()
    b = simulate(plain, closed_loop(3), 40, cost, 0).metrics()
    assert a == b and a["el"] == 1.0 and a["acceptance_rate"] is None
    # c = 1: every request is prefill + (T - 1) one-row steps, back to back
    r = simulate(plain, closed_loop(1), 5, cost, 0, config=ServerConfig(max_num_seqs=1))
    expected = sum(cost.prefill_s(p) + (o - 1) * (cost.step_s(1, 1, 0) + cost.other_s(1))
                   for p, o in zip(plain.prompt_tokens, plain.output_tokens))
    assert r.makespan == pytest.approx(expected, rel=1e-9)


def test_speculation_with_full_acceptance_commits_gamma_plus_one():
    t = ChainTable.from_chains(chains(n=4, a=1.0, out=(100, 101)), 16)
    m = simulate(t, closed_loop(1), 4, LinearCost(), 4).metrics()
    assert m["acceptance_rate"] == 1.0
    assert m["el"] == pytest.approx(5.0, rel=0.03)  # the last round of each request is cut short


def test_small_kv_budget_reserves_candidates_and_preempts():
    t = table(n=10, out=(80, 120), prompt=(100, 150))
    cfg = ServerConfig(max_num_seqs=8, kv_budget_tokens=900)
    r = simulate(t, closed_loop(8), 60, LinearCost(), 8, config=cfg)
    m = r.metrics()
    assert m["preemptions"] > 0 and m["recompute_s"] > 0
    assert np.array_equal(r.ledger.out, r.ledger.target)  # preempted requests keep their tokens and finish
    big = simulate(t, closed_loop(8), 60, LinearCost(), 8, config=ServerConfig(max_num_seqs=8)).metrics()
    assert big["preemptions"] == 0
    assert m["peak_kv_tokens"] <= 900 or m["mean_batch"] == 1  # one request alone may exceed it
    # the reservation counts candidates: with gamma 0 the same budget preempts less
    plain = simulate(t, closed_loop(8), 60, LinearCost(), 0, config=cfg).metrics()
    assert plain["preemptions"] < m["preemptions"]
    # a drafter that fills little: reserving the full gamma (vLLM's lookahead slots) preempts more
    for c in (cs := chains(n=10, out=(80, 120), prompt=(100, 150))):
        c.fill = [0.5, 0.5, 0.5, 0.5]
    t2 = ChainTable.from_chains(cs, 16)
    lazy = simulate(t2, closed_loop(8), 60, LinearCost(), 8, config=cfg).metrics()
    full = simulate(t2, closed_loop(8), 60, LinearCost(), 8,
                    config=ServerConfig(8, kv_budget_tokens=900, reserve_gamma=True)).metrics()
    assert full["preemptions"] > lazy["preemptions"]


def test_replay_arrivals(tmp_path):
    from specledger.errors import SpecLedgerError
    from specledger.simulate.arrivals import replay_file

    f = tmp_path / "offsets.json"
    f.write_text("[3.0, 1.0, 2.5]")
    arr = replay_file(f)
    assert arr.times.tolist() == [0.0, 1.5, 2.0]
    m = simulate(table(), arr, 3, LinearCost(), 2, config=ServerConfig(4)).metrics()
    assert m["requests"] == 3
    f.write_text('{"a": 1}')
    with pytest.raises(SpecLedgerError):
        replay_file(f)


def test_token_budget_trims_largest_first():
    assert _trim(np.array([8, 1, 4]), 20).tolist() == [8, 1, 4]
    out = _trim(np.array([8, 1, 4]), 7)
    assert out.sum() == 7 and out.max() <= 4 and out[1] == 1
    assert _trim(np.array([3, 3]), 0).tolist() == [0, 0]
    t = table()
    m = simulate(t, closed_loop(8), 50, LinearCost(), 8, config=ServerConfig(8, max_num_batched_tokens=16)).metrics()
    assert m["mean_rows_per_step"] <= 16


def test_chunked_prefill_serves_everyone():
    t = table(prompt=(300, 600))
    cfg = ServerConfig(max_num_seqs=8, max_num_batched_tokens=256, chunked_prefill=True)
    r = simulate(t, closed_loop(8), 40, LinearCost(), 4, config=cfg)
    assert np.array_equal(r.ledger.out, r.ledger.target)
    assert r.metrics()["mean_rows_per_step"] <= 256
    tight = ServerConfig(max_num_seqs=8, max_num_batched_tokens=256, chunked_prefill=True, kv_budget_tokens=2500)
    r = simulate(t, closed_loop(8), 40, LinearCost(), 4, config=tight)
    assert np.array_equal(r.ledger.out, r.ledger.target) and r.metrics()["preemptions"] > 0


def test_spread_between_requests_shows_in_itl_tails_mean_only_hides_it():
    # half the requests accept almost everything, half almost nothing: same mean chain
    cs = chains(n=40, out=(200, 201))
    for i, c in enumerate(cs):
        c.chain = [0.97] * 4 if i % 2 else [0.03] * 4
    t = ChainTable.from_chains(cs, 16)
    cost = LinearCost(a=0.01, b=0.004)
    spread = simulate(t, closed_loop(1), 40, cost, 6, config=ServerConfig(1)).metrics()
    det = simulate(t.mean_only(deterministic=True), closed_loop(1), 40, cost, 6, config=ServerConfig(1)).metrics()
    assert spread["itl_token_std_ms"] > 0
    assert spread["tpot_p99_ms"] > 2 * det["tpot_p99_ms"]  # the slow half of the requests is the tail
    # with a drafter that fills unevenly, chunk gaps vary too (rows per step vary); E[K] every round does not
    for c in cs:
        c.fill = [0.9, 0.6, 0.4, 0.3]
    t = ChainTable.from_chains(cs, 16)
    spread = simulate(t, closed_loop(4), 40, cost, 6, config=ServerConfig(4)).metrics()
    det = simulate(t.mean_only(deterministic=True), closed_loop(4), 40, cost, 6, config=ServerConfig(4)).metrics()
    assert det["itl_std_ms"] < spread["itl_std_ms"]


def test_routers():
    t = table()
    arr = poisson(50.0, 90, seed=0)
    rr = simulate(t, arr, 90, LinearCost(), 2, replicas=3, router=round_robin())
    assert np.bincount(rr.ledger.replica).tolist() == [30, 30, 30]
    # least outstanding: one huge request pins replica 0; the router steers the rest away from it
    cs = chains(n=10, out=(10, 11))
    cs[0].output_tokens = 5000
    t2 = ChainTable.from_chains(cs, 16)
    order = np.array([0] + [1 + i % 9 for i in range(59)])
    lo = simulate(t2, poisson(3.0, 60, seed=1), 60, LinearCost(), 2, replicas=2, router=least_outstanding(),
                  order=order, config=ServerConfig(1))
    rr2 = simulate(t2, poisson(3.0, 60, seed=1), 60, LinearCost(), 2, replicas=2, router=round_robin(),
                   order=order, config=ServerConfig(1))
    assert (lo.ledger.replica == 0).sum() < (rr2.ledger.replica == 0).sum()
    def mean_ttft(r):
        return float(np.mean(r.ledger.t_first - r.ledger.arrival))

    assert mean_ttft(lo) < 0.5 * mean_ttft(rr2)


def test_capacity_plan_is_monotone_in_rate():
    t = table()
    slo = SLO(ttft_p99_ms=500.0)
    rows = capacity_plan(t, [2.0, 8.0, 32.0], slo, LinearCost(), [0, 4], ServerConfig(8), n_requests=300)
    for setting in ("plain", "4"):
        needed = [r["replicas"] for r in rows if r["setting"] == setting]
        assert all(n is not None for n in needed)
        assert needed == sorted(needed) and needed[-1] > needed[0]


def test_roofline_is_labelled_and_monotone():
    m = ModelConfig(params=8e9, layers=32, heads=32, kv_heads=8, head_dim=128, dtype="bfloat16", name="8b")
    c = roofline("h200", m)
    assert "roofline" in c.source and "assumed" in c.source
    xs = [c.step_s(r, 8, 1000) for r in (8, 16, 64, 512, 4096)]
    assert xs == sorted(xs) and xs[-1] > xs[0]
    assert roofline("h100", m).step_s(8, 8, 1000) > c.step_s(8, 8, 1000)  # less bandwidth, slower decode
    assert c.kv_budget_tokens() > 100_000


# ---------------------------------------------------------------------------------- CLI
def _record(pid, drafter, gamma, rounds, prompt=120, category="code"):
    from specledger.records import RequestRecord, RoundRecord

    rds = [RoundRecord(drafter, gamma, p, k, k + 1, False, 1e-5, 0.02, 1e-4, prompt + i, 1)
           for i, (p, k) in enumerate(rounds)]
    out = 1 + sum(rd.committed for rd in rds)
    times = list(np.linspace(0.05, 0.05 + 0.02 * len(rds), out))
    return RequestRecord(f"{pid}-{drafter}-{gamma}", drafter, gamma, 0.0, 1.0, 0, 0, prompt, out, "", [], "length",
                         0.05, times[0], times[-1], times, [1] * out, rds, category, pid)


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    recs = []
    for i in range(4):
        recs.append(_record(f"p{i}", "none", 0, [(0, 0)] * 20))
        recs.append(_record(f"p{i}", "ngram", 4, [(4, (i + j) % 5) for j in range(10)]))
    (tmp_path / "traces.jsonl").write_text("".join(r.to_json() + "\n" for r in recs), encoding="utf-8")
    return tmp_path


def _cli(argv, capsys):
    return run_cli(argv, capsys)


def test_cli_json_points(run_dir, capsys):
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--concurrency", "1,4", "--gamma", "2,4",
                           "--requests", "30", "--json", "--out", str(run_dir)], capsys)
    assert code == 0, err
    points = json.loads(out)
    assert len(points) == 2 * 3
    for p in points:
        assert {"concurrency", "throughput_tok_s", "tpot_p50_ms", "ttft_p50_ms", "itl_p99_ms", "preemptions"} <= set(p)
    doc = json.loads((run_dir / "simulate.json").read_text())
    assert doc["points"] == points and doc["cost_source"]
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--rate", "5", "--gamma", "4", "--requests", "30",
                           "--json"], capsys)
    assert code == 0, err
    assert all("rate" in p for p in json.loads(out))


@pytest.mark.parametrize("argv, needle", [
    (["--from", "/nonexistent/run", "--concurrency", "1"], "run directory not found"),
    (["--rate", "-2"], "--rate"),
    (["--rate", "fast"], "--rate"),
    (["--concurrency", "4", "--hardware", "tpu9"], "unknown hardware"),
    (["--concurrency", "4", "--hardware", "h200"], "--model-config"),
    (["--concurrency", "4", "--gamma", "sometimes"], "--gamma"),
    (["--concurrency", "4", "--drafter", "suffix"], "drafter 'suffix'"),
])
def test_cli_one_line_errors(run_dir, capsys, argv, needle):
    if "--from" not in argv:
        argv = ["--from", str(run_dir), *argv]
    code, out, err = _cli(["simulate", *argv], capsys)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_report_shows_the_simulated_section(run_dir, capsys):
    from specledger.report.build import build_report

    code, _, err = _cli(["simulate", "--from", str(run_dir), "--concurrency", "1,4", "--gamma", "4", "--requests", "20",
                         "--contexts", "128,512", "--out", str(run_dir)], capsys)
    assert code == 0, err
    summary, html = build_report(run_dir, n_resamples=50)
    text = html.read_text(encoding="utf-8")
    assert summary["experiments"]["simulate"]["points"]
    for div in ('id="simulate-table"', 'id="plot-simulate-throughput"', 'id="plot-simulate-crossover-map"'):
        assert div in text
    assert "not measured" in text


@pytest.mark.parametrize("policy", ["heuristic", "ema", "goodput", "batch"])
def test_policies_from_the_engine_drive_gamma(policy):
    t = table()
    m = simulate(t, closed_loop(4), 30, LinearCost(), policy,
                 config=ServerConfig(4, kv_budget_tokens=700)).metrics()
    assert m["requests"] == 30 and m["el"] >= 1.0
    assert m["acceptance_rate"] is not None or policy == "batch"


def test_cli_policy_only_and_roofline(run_dir, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                               "torch_dtype": "bfloat16"}))
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--concurrency", "2", "--gamma", "goodput",
                           "--hardware", "h200", "--model-config", str(cfg), "--requests", "20", "--json"], capsys)
    assert code == 0, err
    points = json.loads(out)
    assert [p["setting"] for p in points] == ["plain", "ngram γ=goodput"]
    assert points[0]["throughput_tok_s"] > 0
    assert points[0]["break_even_verify_premium"] is None  # plain verifies nothing
    assert points[1]["break_even_verify_premium"] is not None and points[1]["verify_ratio"] >= 1.0
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--concurrency", "2", "--gamma", "2",
                           "--hardware", "h200", "--model-config", str(cfg), "--requests", "20",
                           "--roofline-terms", "bound"], capsys)
    assert code == 0, err
    flat = " ".join(out.split())  # the console wraps lines
    assert "break-even x:" in flat and "cost: roofline lower bound H200" in flat
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--concurrency", "2", "--hardware", "h200",
                           "--model-config", str(cfg), "--roofline-terms", "fast"], capsys)
    assert code == 2 and "bound, graphs, eager" in err and "Traceback" not in err


def _serving_run(tmp_path: Path) -> Path:
    """A small synthetic serving sweep: concurrency 1 and 2, plain and ngram γ=2, two repeats."""
    from specledger.records import RequestRecord, RoundRecord

    rng = np.random.default_rng(0)
    prompts = ["a", "b", "c", "d"]
    recs, points = [], []
    for c in (1, 2):
        for setting, g in (("plain", 0), ("ngram γ=2", 2)):
            walls = []
            for rep in range(2):
                t_total = 0.0
                for i in range(max(2 * c, 4)):
                    rds, t = [], 0.05
                    times = [t]
                    while len(times) < 24:
                        k = int(rng.integers(0, g + 1)) if g else 0
                        dt = 0.02 + 0.004 * (g + 1) + rng.normal(0, 1e-4)
                        rds.append(RoundRecord("ngram" if g else "none", g, g, k, k + 1, False, 1e-5, dt, 1e-4,
                                               100 + len(times), 1))
                        t += dt
                        times += [t] * (k + 1)
                    times = times[:24]
                    recs.append(RequestRecord(f"r{c}{setting}{rep}{i}", "ngram" if g else "none", g, 0.0, 1.0, 0, 0,
                                              100, 24, "", [], "length", 0.05, times[0], times[-1], times,
                                              [1] * 24, rds, "code", prompts[i % 4],
                                              extra={"experiment": "serving", "kind": "concurrency", "load": c,
                                                     "setting": setting, "repeat": rep}))
                    t_total += times[-1]
                walls.append(t_total / c)
            points.append({"kind": "concurrency", "load": c, "setting": setting,
                           "repeats": [{"wall_s": w} for w in walls]})
    (tmp_path / "traces.jsonl").write_text("".join(r.to_json() + "\n" for r in recs), encoding="utf-8")
    (tmp_path / "serving.json").write_text(json.dumps({"prompts": prompts, "concurrency": points}))
    return tmp_path


def test_validation_against_a_serving_run_compares_every_point(tmp_path):
    from specledger.cost.loader import load_pricer as load_cost
    from specledger.simulate.measured_run import RunSource
    from specledger.simulate.profile import fit_serving_cost
    from specledger.simulate.validate import validate

    run = RunSource.open(_serving_run(tmp_path))
    res = validate(run, seeds=2)
    assert len(res["points"]) == 4
    for p in res["points"]:
        for m in ("throughput_tok_s", "tpot_p50_ms", "ttft_p50_ms", "itl_p99_ms"):
            assert p[m]["real"] > 0 and p[m]["sim"] > 0 and p[m]["error"] is not None
            assert p[m]["noise"]["method"] == "blocked by repeat" and p[m]["noise"]["settings"] == 2
            assert p[m]["real_ci_half"] >= 0 and p[m]["real_ci_half_unblocked"] is not None
    assert {c["load"] for c in res["crossover"]} == {1, 2}
    assert all("other than" in s for s in res["cost_source"].values())  # leave-one-repeat-out
    cost = fit_serving_cost(run.serving_records())
    (tmp_path / "profile.json").write_text(json.dumps(cost.to_dict()))
    again = load_cost(tmp_path / "profile.json")
    assert again.step_s(8, 2, 100) == pytest.approx(cost.step_s(8, 2, 100))
    assert cost.step_s(8, 2, 100) >= cost.step_s(2, 2, 100)


# ---------------------------------------------------------------------------------- break-even verify premium
class ScaledVerify:
    """A cost whose forward costs ``x`` times as much whenever a request verifies candidates (rows > batch)."""

    step_s_many = None  # not the inner cost's: every step through step_s

    def __init__(self, cost, x):
        self.inner, self.x = cost, x

    def step_s(self, rows, batch, context):
        t = self.inner.step_s(rows, batch, context)
        return self.x * t if rows > batch else t

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("cost", [LinearCost(a=0.01, b=2e-4, c=1e-7, d=5e-4),
                                  roofline("h200", ModelConfig(8.03e9, 32, 32, 8, 128, vocab=128256))],
                         ids=["linear", "roofline"])
@pytest.mark.parametrize("fast", [False, True])
def test_break_even_premium_is_where_the_speedup_vanishes(cost, fast):
    """Closed loop, one replica, no chunked prefill: the schedule does not depend on step times, so
    re-running with the verify forwards scaled by x* gives a speed-up of exactly 1.0 (to rounding)."""
    t = table(n=12, seed=3)
    t.fill[:, 2:] = 0.8  # some rounds propose nothing: steps without candidates are not verify steps
    cfg = ServerConfig(max_num_seqs=4)
    plain = simulate(t, closed_loop(4), 60, cost, 0, config=cfg, fast=fast).metrics()
    spec = simulate(t, closed_loop(4), 60, cost, 4, config=cfg, fast=fast).metrics()
    s = spec["throughput_tok_s"] / plain["throughput_tok_s"]
    premium = break_even_verify_premium(s, spec)
    assert plain["verify_s"] == 0 and break_even_verify_premium(1.0, plain) is None
    x = premium / spec["verify_ratio"]
    assert x == pytest.approx(1 + (s - 1) * spec["wall_s"] / spec["verify_s"], rel=1e-12)
    again = simulate(t, closed_loop(4), 60, ScaledVerify(cost, x), 4, config=cfg, fast=fast).metrics()
    assert again["tokens"] == spec["tokens"] and again["steps"] == spec["steps"]
    assert again["throughput_tok_s"] / plain["throughput_tok_s"] == pytest.approx(1.0, rel=1e-9)
    assert again["verify_s"] == pytest.approx(x * spec["verify_s"], rel=1e-9)


def test_blocked_noise_takes_out_the_drift_common_to_a_repeat():
    """Repeats where the machine ran 20 % slow for every setting alike leave no residual noise; noise that
    differs between settings within a repeat is measured, and the half-width shrinks as repeats are added."""
    from specledger.simulate.validate import blocked_noise, half_width, mean_ci_half

    level = np.array([40.0, 38.0, 33.0])[:, None]
    drift = np.array([1.0, 0.8, 1.1, 0.9, 1.05])[None, :]
    sd, dof = blocked_noise(level * drift)
    assert sd == pytest.approx(0.0, abs=1e-12) and dof == 8
    assert mean_ci_half(list(level[0] * drift[0])) / 40 > 0.1  # unblocked, the drift alone spans ±10 %+
    rng = np.random.default_rng(1)
    noisy = level * drift * np.exp(rng.normal(0, 0.03, (3, 400)))[:, :5]
    sd, _ = blocked_noise(noisy)
    assert 0.005 < sd < 0.08
    assert half_width(sd, 20, 3) < half_width(sd, 5, 3)
    assert half_width(0.03, 5, 1) > half_width(0.03, 5, 3)  # fewer degrees of freedom unblocked
    assert blocked_noise([[1.0, 2.0]]) is None and blocked_noise([[1.0, float("nan")], [1.0, 2.0]]) is None
