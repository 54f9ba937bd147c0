"""The four gates and the verdict on constructed cases."""

from __future__ import annotations

import json
import math

import pytest
from synthetic import plain_rounds, request_from_rounds, spec_rounds

from specledger.analysis.paired import RatioInterval
from specledger.errors import SpecLedgerError
from specledger.gates import (
    FAIL,
    NOT_ASSESSED,
    PASS,
    SLO,
    capacity_gate,
    correctness_gate,
    latency_gate,
    load_slo,
    quality_gate,
    verdicts,
)


def _plain(pid, n=6, ids=None, quality=None, temperature=0.0):
    return request_from_rounds(
        f"b{pid}", pid, plain_rounds(n, 0.01), token_ids=ids, quality=quality, temperature=temperature
    )


def _spec(pid, ks=(1, 1, 1), ids=None, quality=None, temperature=0.0):
    return request_from_rounds(
        f"s{pid}",
        pid,
        spec_rounds("ng", 2, list(ks), 0.001, 0.012),
        token_ids=ids,
        quality=quality,
        temperature=temperature,
    )


# ----------------------------------------------------------------------------- SLO loading


def test_load_slo_defaults_toml_and_json(tmp_path):
    assert load_slo(None) == SLO()
    toml = tmp_path / "slo.toml"
    toml.write_text("[slo]\nttft_p99_ms = 800\nstall_ms = 250.5\nrequire_assessed = true\n")
    slo = load_slo(toml)
    assert (slo.ttft_p99_ms, slo.stall_ms, slo.require_assessed, slo.tpot_p50_ms) == (
        800.0,
        250.5,
        True,
        200.0,
    )
    js = tmp_path / "slo.json"
    js.write_text(json.dumps({"itl_p99_ms": 100, "max_memory_mb": 4096}))
    assert load_slo(js).itl_p99_ms == 100.0 and load_slo(js).max_memory_mb == 4096.0


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.toml", "ttft_p99 = 5\n", "unknown SLO key"),
        ("a.toml", "ttft_p99_ms = -1\n", "non-negative number"),
        ("a.toml", "ttft_p99_ms = 'fast'\n", "non-negative number"),
        ("a.toml", "ttft_p99_ms = \n", "not valid TOML"),
        ("a.json", "{not json", "not valid JSON"),
        ("a.json", "[1, 2]", "expected a table"),
        ("a.yaml", "ttft_p99_ms: 5", "must end in .toml or .json"),
        ("a.toml", "require_assessed = 1\n", "true or false"),
        ("a.toml", "equivalence_margin = 0.5\n", r"'equivalence_margin' must be in \(0, 0.5\)"),
        ("a.toml", "equivalence_margin = 0\n", r"'equivalence_margin' must be in \(0, 0.5\)"),
        ("a.toml", "decision_alpha = 0.6\n", r"'decision_alpha' must be in \(0, 0.5\)"),
    ],
)
def test_load_slo_rejects_bad_files_with_a_clear_message(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecLedgerError, match=message):
        load_slo(path)


def test_load_slo_missing_file(tmp_path):
    with pytest.raises(SpecLedgerError, match="not found"):
        load_slo(tmp_path / "nope.toml")


# ----------------------------------------------------------------------------- correctness


def test_greedy_correctness_passes_when_token_identical():
    spec = [_spec(f"p{i}") for i in range(4)]
    base = [_plain(f"p{i}") for i in range(4)]
    result = correctness_gate(spec, base, 0.0)
    assert result.status == PASS and "4/4" in result.evidence


def test_one_greedy_mismatch_fails_correctness():
    spec = [_spec(f"p{i}") for i in range(4)]
    spec[2] = _spec("p2", ids=[0, 1, 2, 99, 4, 5])
    base = [_plain(f"p{i}") for i in range(4)]
    result = correctness_gate(spec, base, 0.0)
    assert result.status == FAIL
    assert "prompt p2 at token 3" in result.evidence


def test_correctness_not_assessed_without_shared_prompts():
    assert correctness_gate([_spec("a")], [_plain("b")], 0.0).status == NOT_ASSESSED


def test_sampled_correctness_one_sample_per_prompt_is_not_assessed():
    spec = [_spec(f"p{i}", temperature=0.8) for i in range(40)]
    base = [_plain(f"p{i}", temperature=0.8) for i in range(40)]
    result = correctness_gate(spec, base, 0.8)
    assert result.status == NOT_ASSESSED and result.evidence.startswith("not assessed (power 0 %)")


def test_sampled_correctness_passes_same_distribution_and_fails_a_shifted_one():
    import random

    rng = random.Random(0)

    def draws(weights, n, shift_at=None):
        out = []
        for _ in range(n):
            ids = [0] + [rng.choices(range(4), weights)[0] for _ in range(5)]
            if shift_at is not None and rng.random() < 0.5:
                ids[shift_at] = 3
            out.append(ids)
        return out

    w = [0.4, 0.3, 0.2, 0.1]
    base = [_plain("p", ids=ids, temperature=0.7) for ids in draws(w, 600)]
    same = [_spec("p", ks=[1, 1], ids=ids, temperature=0.7) for ids in draws(w, 600)]
    ok = correctness_gate(same, base, 0.7)
    assert ok.status == PASS and "power" in ok.evidence
    shifted = [_spec("p", ks=[1, 1], ids=ids, temperature=0.7) for ids in draws(w, 600, shift_at=2)]
    bad = correctness_gate(shifted, base, 0.7)
    assert bad.status == FAIL and "position 2" in bad.evidence


# ----------------------------------------------------------------------------- quality / latency / capacity


def test_quality_gate_tolerance_and_not_assessed():
    base = [_plain(f"p{i}", quality=0.60) for i in range(3)]
    assert quality_gate([_spec(f"p{i}") for i in range(3)], base).status == NOT_ASSESSED
    assert quality_gate([_spec(f"p{i}", quality=0.59) for i in range(3)], base, 0.02).status == PASS
    worse = quality_gate([_spec(f"p{i}", quality=0.55) for i in range(3)], base, 0.02)
    assert worse.status == FAIL and "-0.050" in worse.evidence


def _latency(ttft=100.0, tpot=20.0, itl=50.0, stall=80.0):
    return {
        "ttft_ms": {"p99": ttft},
        "tpot_ms": {"p50": tpot},
        "itl_chunk_ms": {"p99": itl},
        "longest_stall_ms": stall,
    }


def test_latency_gate_against_slo():
    assert latency_gate(_latency(), SLO()).status == PASS
    result = latency_gate(_latency(stall=1500.0), SLO())
    assert result.status == FAIL and "stall 1500.0>1000 ms" in result.evidence
    assert latency_gate(_latency(ttft=900.0), SLO(ttft_p99_ms=800)).status == FAIL
    empty = {
        "ttft_ms": {"p99": None},
        "tpot_ms": {"p50": None},
        "itl_chunk_ms": {"p99": None},
        "longest_stall_ms": None,
    }
    assert latency_gate(empty).status == NOT_ASSESSED


def test_capacity_gate_throughput_and_memory():
    assert capacity_gate(120.0, 100.0, None).status == PASS
    # slower than plain is the speed-up's test (paired, with its interval), not a capacity failure at load 1
    slower = capacity_gate(90.0, 100.0, None)
    assert slower.status == PASS and "90.0 tok/s vs plain 100.0" in slower.evidence
    assert capacity_gate(None, 100.0, None).status == NOT_ASSESSED
    over = capacity_gate(120.0, 100.0, 3 * 2**30, SLO(max_memory_mb=2048))
    assert over.status == FAIL and "3072 MiB > 2048" in over.evidence
    assert "no limit set" in capacity_gate(120.0, 100.0, 2**30).evidence


# ----------------------------------------------------------------------------- verdict


def _scenario(drafter, gamma, s, ci, statuses=("pass",) * 4, category="code", temperature=0.0):
    gates = {
        n: {"name": n, "status": st, "evidence": "e"}
        for n, st in zip(("correctness", "quality", "latency", "capacity"), statuses)
    }
    return {
        "category": category,
        "temperature": temperature,
        "drafter": drafter,
        "gamma": gamma,
        "label": f"{drafter} γ={gamma}",
        "speedup": s,
        "speedup_ci": list(ci),
        "gates": gates,
    }


def _paired(drafter, gamma, plain_seconds, ratios, statuses=("pass",) * 4, category="code", tokens=40.0,
            rounds_per_request=10.0):
    """A scenario with per-prompt totals: prompt i ran ``plain_seconds[i]`` plain and ``/ ratios[i]`` with
    this setting (same tokens: greedy), so its per-prompt speed-up is ratios[i]."""
    ids = [f"p{i}" for i in range(len(plain_seconds))]
    sec = [b / r for b, r in zip(plain_seconds, ratios)]
    s_point = sum(plain_seconds) / sum(sec)
    sc = _scenario(drafter, gamma, s_point, (None, None), statuses, category)
    sc.update(paired_prompts=len(ids), per_prompt={"prompts": ids, "tokens": [tokens] * len(ids), "seconds": sec,
                                                   "base_tokens": [tokens] * len(ids), "base_seconds": plain_seconds},
              rounds={"full_rounds": rounds_per_request * len(ids), "el_full": 2.5},
              totals={"requests": len(ids), "tokens": tokens * len(ids)})
    return sc


PLAIN = [1.0, 2.0, 1.5, 3.0, 0.8, 2.2, 1.1, 1.7]


def test_paired_ratio_interval_is_exact_for_equal_per_prompt_ratios_and_unbounded_for_few_prompts():
    """The interval is a confidence sequence (analysis.sequential): below 4 prompts it cannot exclude anything, not
    even for per-prompt ratios that agree exactly (the scale-invariant mixture's evidence is at most
    (1 + nρ²)^((n−1)/2): 7 at 3 prompts, under 1/α = 20); from 4 on, equal ratios give an exact interval."""
    from specledger.analysis.paired import EQUIVALENT, FASTER, OPEN, ratio_interval, t_quantile

    flat = ratio_interval([([2.0, 4.0, 6.0, 5.0], 1), ([1.0, 2.0, 3.0, 2.5], -1)])
    assert flat.ratio == pytest.approx(2.0) and flat.lo == pytest.approx(2.0) and flat.hi == pytest.approx(2.0)
    three = ratio_interval([([2.0, 4.0, 6.0], 1), ([1.0, 2.0, 3.0], -1)])
    assert three.ratio == pytest.approx(2.0) and three.lo == -math.inf and three.hi == math.inf
    two = ratio_interval([([2.0, 1.0], 1), ([1.0, 1.0], -1)])
    assert two.lo < 1.0 < two.hi
    assert t_quantile(0.95, 1) == pytest.approx(6.314, rel=1e-3)  # the per-look t of before: kept for comparisons
    assert flat.verdict(0.03) == FASTER and two.verdict(0.03) == OPEN and three.verdict(0.03) == OPEN
    same = ratio_interval([([1.0, 1.01, 0.99, 1.0, 1.0, 1.01, 0.99, 1.0], 1), ([1.0] * 8, -1)])
    assert same.verdict(0.03) == EQUIVALENT and same.verdict(0.001) == OPEN
    assert ratio_interval([([1.0], 1), ([1.0], -1)]).verdict(0.03) == OPEN  # one prompt: nothing to decide


def test_paired_beats_marginal_intervals_a_consistent_11_percent_lead_wins():
    """The make-run case: ngram γ 4 (S 2.0) vs γ 2 (S 1.8) on prompts of very different difficulty.
    Marginal intervals overlap; the per-prompt ratio is steady, so the paired test resolves it."""
    g4 = _paired("ngram", 4, PLAIN, [2.6, 1.5, 2.1, 1.7, 2.3, 1.9, 2.4, 1.6])
    g2 = _paired("ngram", 2, PLAIN, [r / 1.11 for r in [2.6, 1.5, 2.1, 1.7, 2.3, 1.9, 2.4, 1.6]])
    (v,) = verdicts([g2, g4])
    assert (v["decision"], v["drafter"], v["gamma"]) == ("deploy", "ngram", 4)
    assert v["resolved"] is True and v["resolution"] == "winner"
    (cmp,) = v["comparisons"]
    assert cmp["verdict"] == "a faster" and cmp["ratio"] == pytest.approx(1.11, rel=1e-6)


def test_the_pick_is_the_rules_first_setting_within_the_margin_of_the_best():
    """γ 4 leads γ 2 by about 1.4 % over 16 prompts, paired [1.00–1.03]. With a 5 % margin γ 2 is within it
    (safe: nothing can beat it by more than 5 %) and the rule takes it. With 3 % γ 2 is neither safe nor proven
    slower: a rerun could go either way, so the decision stays open with both as contenders."""
    r = [1.6, 1.3, 1.5, 1.4, 1.45, 1.55, 1.35, 1.5] * 2
    lead = [1.04, 0.995, 1.045, 1.0, 1.035, 1.01, 1.045, 1.0] * 2
    g4 = _paired("ngram", 4, PLAIN * 2, [x * k for x, k in zip(r, lead)])
    g2 = _paired("ngram", 2, PLAIN * 2, r)
    (v,) = verdicts([g2, g4])
    assert (v["gamma"], v["resolved"], v["resolution"]) == (2, True, "equivalent")
    assert v["headline"].startswith("no setting is more than 5 % faster than ngram γ=2") and "rule" in v["headline"]
    (v,) = verdicts([g2, g4], SLO(equivalence_margin=0.03))
    assert v["resolved"] is False and set(v["contenders"]) == {"ngram γ=4", "ngram γ=2"}
    assert v["decision"] == "deploy" and v["gamma"] == 4  # the provisional deploy is the fastest that pays
    slow = _paired("ngram", 2, PLAIN * 2, [x / 1.12 for x in r])  # proven slower: passed over, γ 4 resolves
    (v,) = verdicts([slow, g4], SLO(equivalence_margin=0.03))
    assert (v["gamma"], v["resolved"]) == (4, True)


def test_equivalent_settings_resolve_and_the_rule_picks_the_cheaper():
    r = [1.5, 1.4, 1.6, 1.45, 1.55, 1.5, 1.52, 1.48]
    suffix4 = _paired("suffix", 4, PLAIN, [x * 1.01 for x in r])
    ngram2 = _paired("ngram", 2, PLAIN, r)
    (v,) = verdicts([suffix4, ngram2], SLO(equivalence_margin=0.03))
    assert v["resolved"] is True and v["resolution"] == "equivalent"
    assert (v["drafter"], v["gamma"]) == ("ngram", 2) and v["equivalent_to"] == ["suffix γ=4"]
    assert "no setting is more than 3 % faster than ngram γ=2" in v["headline"] and "rule" in v["headline"]
    (v,) = verdicts([suffix4, ngram2], SLO(equivalence_margin=0.001))  # a tighter margin: the 1 % is real
    assert (v["drafter"], v["resolution"]) == ("suffix", "winner")


def test_an_open_comparison_deploys_the_leader_unresolved_with_prompts_needed():
    a = _paired("ngram", 4, PLAIN[:6], [2.0, 1.5, 2.2, 1.9, 1.7, 2.1])
    b = _paired("suffix", 4, PLAIN[:6], [1.8, 1.7, 2.0, 1.9, 1.8, 1.9])
    (v,) = verdicts([a, b])
    assert v["decision"] == "deploy" and v["resolved"] is False and v["resolution"] == "open"
    assert v["prompts_needed"] is not None and v["prompts_needed"] > 6 and "paired ratio" in v["headline"]


def test_off_is_resolved_when_slower_or_within_the_margin_of_plain_and_open_when_it_straddles_one():
    (v,) = verdicts([_paired("ngram", 2, PLAIN, [0.8, 0.82, 0.79, 0.81, 0.8, 0.8, 0.83, 0.78])])
    assert (v["decision"], v["resolution"], v["resolved"]) == ("off", "off", True) and "S < 1" in v["headline"]
    (v,) = verdicts([_paired("ngram", 2, PLAIN, [1.01, 1.0, 1.005, 1.01, 0.995, 1.0, 1.01, 1.0])])
    assert (v["decision"], v["resolved"]) == ("off", True) and "no practical gain" in v["headline"]
    (v,) = verdicts([_paired("ngram", 2, PLAIN[:3], [1.3, 0.8, 1.1])])
    assert (v["decision"], v["resolution"], v["resolved"]) == ("off", "open", False)


def test_off_names_speed_before_a_gate_when_the_fastest_setting_is_slower_anyway():
    slow = _paired("ngram", 2, PLAIN, [0.8] * 8, statuses=("pass", "pass", "fail", "pass"))
    (v,) = verdicts([slow])
    assert v["decision"] == "off" and "S < 1" in v["reason"] and "latency" not in v["reason"]
    fast = _paired("ngram", 2, PLAIN, [1.5] * 8, statuses=("pass", "pass", "fail", "pass"))
    (v,) = verdicts([fast])
    assert v["decision"] == "off" and "fails the latency gate" in v["reason"] and v["resolved"] is True


def test_too_few_speculative_rounds_get_no_decision():
    """The raw-text case: an instruct model answers with EOS at once, 0 speculative rounds per request;
    prefill noise must not become a resolved deploy or off."""
    s = _paired("ngram", 2, PLAIN, [1.06] * 8, tokens=1.0, rounds_per_request=0.0)
    (v,) = verdicts([s])
    assert v["decision"] == "no-decision" and v["resolved"] is False and v["drafter"] is None
    assert "messages" in v["reason"] and "max-tokens" in v["reason"]


def test_not_assessed_is_named_and_blocks_only_when_required():
    s = _paired("ngram", 2, PLAIN, [1.5] * 8, statuses=("pass", "not assessed", "pass", "pass"))
    (v,) = verdicts([s])
    assert v["decision"] == "deploy" and "Not assessed: quality" in v["reason"]
    (v,) = verdicts([s], SLO(require_assessed=True))
    assert v["decision"] == "off"


def test_without_per_prompt_totals_intervals_compare_by_overlap_only():
    scenarios = [_scenario("ngram", 2, 1.25, (1.2, 1.3)), _scenario("ngram", 4, 1.6, (1.4, 1.9)),
                 _scenario("draft", 4, 1.9, (1.5, 2.2), statuses=("fail", "pass", "pass", "pass"))]
    (v,) = verdicts(scenarios)
    assert (v["decision"], v["drafter"], v["gamma"], v["resolved"]) == ("deploy", "ngram", 4, True)
    (v,) = verdicts(scenarios + [_scenario("ngram", 8, 1.7, (0.9, 2.5))])
    assert (v["drafter"], v["gamma"], v["resolved"]) == ("ngram", 4, False)  # γ 8 could still be faster


def test_the_slo_out_of_reach_at_a_load_is_said_and_latency_is_judged_against_plain():
    """The agent case: plain's TTFT P99 2348 ms misses 2000 ms at load 1; ngram γ 4 (2325.7 ms) changes
    nothing there, so the verdict is about S, and the load is named out of reach."""
    from specledger.gates.latency import latency_gate

    def lat(ttft):
        return {"ttft_ms": {"p99": ttft}, "tpot_ms": {"p50": 35.0}, "itl_chunk_ms": {"p99": 65.0},
                "longest_stall_ms": 68.0}

    plain = latency_gate(lat(2348.0))
    assert plain.status == "fail"
    g = latency_gate(lat(2325.7), SLO(), lat(2348.0))
    assert g.status == "pass" and "vs plain 2348.0" in g.evidence and "plain misses 2000 too" in g.evidence
    assert latency_gate(lat(2325.7)).status == "fail"  # alone it fails
    assert latency_gate(lat(3000.0), SLO(), lat(2348.0)).status == "fail"  # much worse than plain: still a fail
    # ngram prefills exactly as plain: its TTFT beyond plain's is the machine's noise, judged on plain's figure
    assert latency_gate(lat(3000.0), SLO(), lat(2348.0), "ngram").status == "pass"
    assert latency_gate(lat(3000.0), SLO(), lat(2348.0), "layerskip").status == "fail"
    assert latency_gate(lat(3000.0), SLO(), lat(1500.0), "ngram").status == "fail"  # plain meets it: absolute
    s = _paired("ngram", 4, PLAIN, [1.22] * 8)
    s["gates"]["latency"] = g.to_dict()
    (v,) = verdicts([s], plain_latency={("code", 0.0): plain})
    assert v["decision"] == "deploy" and v["slo_out_of_reach"].startswith("SLO out of reach at load 1")
    assert "TTFT P99 2348.0>2000 ms" in v["slo_out_of_reach"] and "fails the latency" not in v["reason"]


def test_the_random_control_is_never_deployed_and_reads_as_a_control():
    from specledger.gates import control_repetition, repeated_ngram_fraction

    assert repeated_ngram_fraction([1, 2, 3, 4, 1, 2, 3, 4, 1, 2]) == 3 / 7
    assert repeated_ngram_fraction([1, 2, 3]) is None
    plain = request_from_rounds("b", "r0", plain_rounds(10, 0.01), token_ids=[1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    plain.category = "random"
    rep = control_repetition([plain])
    (v,) = verdicts([_scenario("suffix", 4, 2.43, (2.2, 2.6), category="random")], controls=rep)
    assert v["decision"] == "control" and v["drafter"] is None
    assert "43 % of their 4-grams" in v["reason"] and "S = 2.43" in v["reason"] and "never deployed" in v["reason"]


def test_verdict_per_category_and_temperature():
    out = verdicts(
        [
            _scenario("ngram", 2, 1.5, (1.3, 1.7)),
            _scenario("ngram", 2, 0.8, (0.7, 0.9), temperature=0.7),
            _scenario("ngram", 2, 1.2, (1.1, 1.3), category="chat"),
        ]
    )
    assert {(v["category"], v["temperature"], v["decision"]) for v in out} == {
        ("code", 0.0, "deploy"),
        ("code", 0.7, "off"),
        ("chat", 0.0, "deploy"),
    }


def test_prompts_to_separate_says_nothing_for_a_nan_speedup():
    from specledger.gates import prompts_to_separate

    nan = float("nan")
    assert prompts_to_separate({"speedup": nan, "speedup_ci": [nan, nan], "paired_prompts": 2}) is None
    assert prompts_to_separate({"speedup": 1.2, "speedup_ci": [1.1, 1.3], "paired_prompts": 2},
                               {"speedup": nan, "speedup_ci": [0.9, 1.4]}) is None


def test_a_verdict_that_hinges_on_a_marginal_latency_gate_is_not_resolved():
    """Two quiet `make run`s (summary, load 1): ngram γ 2 failed on TTFT P99 2011 > 2000 ms in one and
    passed at 1733 ms in the other, so the 'resolved' pick flipped. Within the SLO's margin the verdict
    says it is undecided."""
    from specledger.gates.latency import latency_gate

    def lat(ttft):
        return {"ttft_ms": {"p99": ttft}, "tpot_ms": {"p50": 35.0}, "itl_chunk_ms": {"p99": 65.0},
                "longest_stall_ms": 68.0}

    fail, near_pass, clear = (latency_gate(lat(x)) for x in (2011.1, 1904.9, 1500.0))
    assert (fail.status, fail.marginal) == ("fail", ("TTFT P99",)) and "(marginal)" in fail.evidence
    assert (near_pass.status, near_pass.marginal) == ("pass", ("TTFT P99",)) and clear.marginal == ()
    assert latency_gate(lat(2500.0)).marginal == ()  # a clear fail flips on no drift
    assert latency_gate(lat(2011.1), SLO(margin=0.0)).marginal == ()

    def scen(drafter, gamma, ratio, gate):
        sc = _paired(drafter, gamma, PLAIN, [ratio] * 8)
        sc["gates"]["latency"] = gate.to_dict()
        return sc

    v, = verdicts([scen("ngram", 2, 1.30, fail), scen("suffix", 4, 1.10, near_pass)])
    assert (v["drafter"], v["gamma"], v["resolved"]) == ("suffix", 4, False)
    assert "ngram γ=2 (S 1.30) fails latency (TTFT P99) only within 10 %" in v["reason"]
    assert "suffix γ=4 passes latency (TTFT P99) only within 10 %" in v["reason"]
    v, = verdicts([scen("suffix", 4, 1.10, clear)])
    assert v["resolved"] is True
    v, = verdicts([scen("ngram", 2, 1.30, fail)])  # off only because of a marginal fail
    assert v["decision"] == "off" and v["resolved"] is False and "only within 10 %" in v["reason"]
    v, = verdicts([scen("ngram", 2, 1.30, latency_gate(lat(2500.0)))])
    assert v["decision"] == "off" and v["resolved"] is True


def test_the_margin_is_raised_to_the_runs_own_ttft_drift():
    from specledger.gates import ttft_drift, with_measured_margin

    def rec(pid, drafter, ttft):
        r = request_from_rounds(drafter, pid, plain_rounds(4, 0.01))
        r.drafter, r.ttft = drafter, ttft
        return r

    same = [rec("p0", d, t) for d, t in (("none", 1.0), ("ngram", 1.2), ("suffix", 1.0))]
    assert ttft_drift(same) == pytest.approx(0.2)
    assert ttft_drift(same + [rec("p0", "layerskip", 3.0)]) == pytest.approx(0.2)  # its own prefill: left out
    assert ttft_drift(same[:2]) is None  # two figures say nothing about the spread
    assert with_measured_margin(SLO(), same).margin == pytest.approx(0.2)
    assert with_measured_margin(SLO(margin=0.3), same).margin == 0.3


def test_plains_ttft_is_pooled_over_the_same_prefill_family_so_prompts_run_without_plain_count():
    """A race adds prompts without plain: ngram's slow prefills there (2.5 s, plain's own prefill on those
    prompts) must not read as speculation failing latency. Plain's TTFT P99 pools every same-prefill request,
    so plain misses the TTFT limit too (the SLO is out of reach) and ngram is judged on what it changes."""
    from specledger.gates.solo import solo_decisions

    def rec(make, pid, prefill):
        r = make(pid)
        shift = prefill - r.ttft + 0.0
        r.ttft += shift
        r.t_prefill = prefill
        r.token_times = [t + shift for t in r.token_times]
        r.total_time += shift
        r.category = "code"
        return r

    def ngram(pid):
        return request_from_rounds(f"s{pid}", pid, spec_rounds("ngram", 2, [1, 1, 1], 0.001, 0.012),
                                   token_ids=list(range(6)))

    fast = [f"p{i}" for i in range(4)]
    slow = [f"q{i}" for i in range(4)]
    records = [rec(lambda p: _plain(p, ids=list(range(6))), p, 0.2) for p in fast]
    records += [rec(ngram, p, 0.2) for p in fast] + [rec(ngram, p, 2.5) for p in slow]
    (v,) = solo_decisions(records)
    assert "fails the latency" not in v["reason"]
    assert str(v.get("slo_out_of_reach", "")).startswith("SLO out of reach at load 1")
    # without the pooling (plain's TTFT from its own 4 prompts only) the same records read as a latency failure
    import specledger.gates.solo as solo

    real = solo.pool_prefill_ttft
    try:
        solo.pool_prefill_ttft = lambda plain, records: plain
        (w,) = solo_decisions(records)
    finally:
        solo.pool_prefill_ttft = real
    assert "latency" in w["reason"] and not w.get("slo_out_of_reach")


def _given_intervals(monkeypatch, vs_plain, pair):
    """The verdict module with its intervals given: ``vs_plain[id(scenario)]`` (S against plain) and
    ``pair[(id(a), id(b))]`` (S_a / S_b), read at call time, so a test may change them between verdicts."""
    import importlib

    module = importlib.import_module("specledger.gates.verdicts")  # the package exports a function so named
    monkeypatch.setattr(module, "interval_vs_plain", lambda s, alpha: vs_plain[id(s)])
    monkeypatch.setattr(module, "compare_settings", lambda a, b, ia, ib, alpha: pair[(id(a), id(b))])
    return module


def test_a_cheaper_setting_within_the_margin_is_deployed_only_once_it_beats_plain(monkeypatch):
    """The rule's pick (cheaper in memory, within the margin of the best) must itself be shown faster than plain:
    directly, or through a setting that pays (lo(S_y) · lo(S_x / S_y) > 1). Until then the decision is open and
    the race runs it with plain (the held-out case: suffix γ=2 deployed at S 1.01 [0.86–1.19] after 2 prompts)."""
    fast, cheap = _scenario("suffix", 4, 1.10, (None, None)), _scenario("ngram", 2, 1.05, (None, None))
    vs_plain = {id(fast): RatioInterval(1.10, 1.03, 1.17, 8), id(cheap): RatioInterval(1.05, 0.90, 1.22, 2)}
    pair = {(id(cheap), id(fast)): RatioInterval(0.98, 0.955, 1.01, 6),
            (id(fast), id(cheap)): RatioInterval(1.02, 0.99, 1.047, 6)}
    _given_intervals(monkeypatch, vs_plain, pair)
    (v,) = verdicts([cheap, fast])  # 1.03 · 0.955 < 1: not yet shown to beat plain
    assert (v["resolved"], v["resolution"], v["needs_plain"]) == (False, "open", True)
    assert "ngram γ=2" in v["contenders"] and "not yet shown above 1" in v["headline"]
    vs_plain[id(cheap)] = RatioInterval(1.05, 1.01, 1.09, 8)  # now it pays on its own
    (v,) = verdicts([cheap, fast])
    assert (v["resolved"], v["drafter"], v["gamma"], v["resolution"]) == (True, "ngram", 2, "equivalent")
    vs_plain[id(cheap)] = RatioInterval(1.05, 0.90, 1.22, 2)
    pair[(id(cheap), id(fast))] = RatioInterval(0.99, 0.975, 1.01, 6)  # through suffix γ=4: 1.03 · 0.975 > 1
    (v,) = verdicts([cheap, fast])
    assert (v["resolved"], v["drafter"], v["gamma"]) == (True, "ngram", 2)
    assert ("its own interval [0.90–1.22] is not above 1; faster than plain shown through suffix γ=4: S ≥ 1.030 "
            "(suffix γ=4 vs plain, 8 prompts) × 0.975 (paired ratio, 6 prompts) = 1.004 at 90 %") in v["headline"]
    assert v["shown_through"]["setting"] == "suffix γ=4" and v["shown_through"]["bound"] == pytest.approx(1.00425)
    vs_plain[id(cheap)] = RatioInterval(1.05, 0.90, 1.22, 2)
    pair[(id(cheap), id(fast))] = RatioInterval(0.97, 0.955, 0.99, 6)  # slower, but maybe within the margin: open
    (v,) = verdicts([cheap, fast])
    assert v["resolved"] is False and "ngram γ=2" in v["contenders"]
    pair[(id(cheap), id(fast))] = RatioInterval(0.92, 0.90, 0.94, 6)  # more than 5 % slower: passed over
    (v,) = verdicts([cheap, fast])
    assert (v["resolved"], v["drafter"], v["gamma"]) == (True, "suffix", 4)


def test_a_setting_that_cannot_beat_plain_by_the_margin_cannot_beat_one_that_pays(monkeypatch):
    """The held-out deadlock: suffix γ=2 pays (S 1.06 [1.02–1.11]); suffix γ=4 was dropped after 2 prompts, so
    their paired ratio is wide, but γ=4's own S against plain is at most 1.04: it cannot be more than 5 % faster
    than γ=2 (hi 1.04 / lo 1.02 < 1.05). Resolved, not an open race of one setting against nothing."""
    g2, g4 = _scenario("suffix", 2, 1.06, (None, None)), _scenario("suffix", 4, 1.00, (None, None))
    vs_plain = {id(g2): RatioInterval(1.06, 1.02, 1.11, 6), id(g4): RatioInterval(1.00, 0.96, 1.04, 6)}
    pair = {(id(g2), id(g4)): RatioInterval(1.01, 0.93, 1.09, 2), (id(g4), id(g2)): RatioInterval(0.99, 0.92, 1.07, 2)}
    _given_intervals(monkeypatch, vs_plain, pair)
    (v,) = verdicts([g2, g4])
    assert (v["resolved"], v["decision"], v["gamma"]) == (True, "deploy", 2)
    vs_plain[id(g4)] = RatioInterval(1.00, 0.90, 1.12, 6)  # γ=4 could still be 10 % faster than plain: open
    (v,) = verdicts([g2, g4])
    assert v["resolved"] is False and "suffix γ=4" in v["contenders"]


def test_an_equivalence_needs_six_paired_prompts(monkeypatch):
    """Within the margin after 4 prompts is not yet an equivalence: with 3 degrees of freedom the interval's own
    spread is unsteady, and the race looks after every round. From MIN_EQUIVALENCE_PROMPTS on it is."""
    a, b = _scenario("ngram", 2, 1.20, (None, None)), _scenario("suffix", 4, 1.21, (None, None))
    vs_plain = {id(a): RatioInterval(1.20, 1.10, 1.30, 4), id(b): RatioInterval(1.21, 1.10, 1.32, 4)}
    pair = {(id(a), id(b)): RatioInterval(0.99, 0.96, 1.02, 4), (id(b), id(a)): RatioInterval(1.01, 0.98, 1.04, 4)}
    V = _given_intervals(monkeypatch, vs_plain, pair)
    (v,) = verdicts([a, b])
    assert v["resolved"] is False
    for key in pair:
        pair[key] = RatioInterval(pair[key].ratio, pair[key].lo, pair[key].hi, V.MIN_EQUIVALENCE_PROMPTS)
    (v,) = verdicts([a, b])
    assert (v["resolved"], v["drafter"], v["gamma"], v["resolution"]) == (True, "ngram", 2, "equivalent")


def test_when_nothing_pays_a_setting_still_open_against_plain_is_measured(monkeypatch):
    """The leader is no practical gain, a second setting within the margin of it is still open against plain:
    the decision is open with that setting among the contenders (the race measures it with plain), not a race
    of the leader alone that cannot change the open setting's interval."""
    lead, other = _scenario("ngram", 2, 1.02, (None, None)), _scenario("suffix", 4, 1.00, (None, None))
    vs_plain = {id(lead): RatioInterval(1.02, 0.99, 1.04, 8), id(other): RatioInterval(1.00, 0.93, 1.08, 8)}
    pair = {(id(lead), id(other)): RatioInterval(1.02, 0.99, 1.03, 8),
            (id(other), id(lead)): RatioInterval(0.98, 0.97, 1.01, 8)}
    _given_intervals(monkeypatch, vs_plain, pair)
    (v,) = verdicts([lead, other])
    assert v["resolved"] is False and v["needs_plain"] is True
    assert set(v["contenders"]) == {"ngram γ=2", "suffix γ=4"}
