"""The verdict as a type (:mod:`specledger.gates.decision`): every verdict the rule writes reads back into a
:class:`Verdict` and out again to the same dict, keys and their order included; the readers' properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gates import PLAIN, _paired, _scenario

from specledger.analysis.paired import RatioInterval
from specledger.gates import SLO, GateResult, verdicts
from specledger.gates import decision as D
from specledger.gates.decision import Verdict
from specledger.gates.mix import mix_decisions
from specledger.gates.verdicts import decide, decide_group

GOLDEN = Path(__file__).parent / "data" / "golden_run_summary.json"


def _round_trip(d: dict) -> None:
    back = Verdict.from_dict(d).to_dict()
    assert back == d
    assert list(back) == list(d)  # the same keys in the same order


def test_every_golden_verdict_and_mix_entry_round_trips():
    summary = json.loads(GOLDEN.read_text())
    entries = summary["verdicts"] + summary["mix"]
    assert entries
    for d in entries:
        assert Verdict.from_dict(d).to_dict() == d  # the golden file's keys are sorted: order is not its


def _every_ending() -> list[dict]:
    """Verdicts of every ending the rule writes: winner, the rule's pick among equivalent settings, open, off,
    off on the gates (resolved, and open on a marginal fail), no decision, a control, a context bucket."""
    r = [1.5, 1.4, 1.6, 1.45, 1.55, 1.5, 1.52, 1.48]
    winner = [_paired("ngram", 4, PLAIN, [2.6, 1.5, 2.1, 1.7, 2.3, 1.9, 2.4, 1.6]),
              _paired("ngram", 2, PLAIN, [x / 1.11 for x in [2.6, 1.5, 2.1, 1.7, 2.3, 1.9, 2.4, 1.6]])]
    equivalent = [_paired("suffix", 4, PLAIN, [x * 1.01 for x in r], category="eq"),
                  _paired("ngram", 2, PLAIN, r, category="eq")]
    opened = [_paired("ngram", 4, PLAIN[:6], [2.0, 1.5, 2.2, 1.9, 1.7, 2.1], category="open"),
              _paired("suffix", 4, PLAIN[:6], [1.8, 1.7, 2.0, 1.9, 1.8, 1.9], category="open")]
    slower = [_paired("ngram", 2, PLAIN, [0.8, 0.82, 0.79, 0.81, 0.8, 0.8, 0.83, 0.78], category="slow")]
    failing = [_paired("ngram", 2, PLAIN, [1.3] * 8, ("pass", "fail", "pass", "pass"), category="gated")]
    marginal = _paired("ngram", 2, PLAIN, [1.3] * 8, category="hinge")
    marginal["gates"]["latency"] = GateResult("latency", "fail", "TTFT P99 2011>2000 ms", ("TTFT P99",)).to_dict()
    thin = [_paired("ngram", 2, PLAIN, [1.2] * 8, category="thin", tokens=2.0)]
    unmeasured = [_scenario("ngram", 2, None, (None, None), category="none")]
    control = [_scenario("suffix", 4, 2.43, (2.2, 2.6), category="random")]
    bucket = [_paired("ngram", 2, PLAIN, [1.3] * 8, category="long@1-2k")]
    out = verdicts([*winner, *equivalent, *opened, *slower, *failing, marginal, *thin, *unmeasured, *control,
                    *bucket], controls={("random", 0.0): 0.4})
    out += verdicts([*opened], SLO(equivalence_margin=0.03), controls={})
    plain_fails = {("code", 0.0): GateResult("latency", "fail", "TTFT P99 2348.0>2000 ms")}
    out += [{**v, "load": 4, "simulated": False} for v in verdicts(winner, plain_latency=plain_fails, load=4)]
    return out


def test_every_ending_round_trips_with_its_keys_in_order():
    out = _every_ending()
    resolutions = {v["resolution"] for v in out}
    assert {D.WINNER, D.BY_EQUIVALENCE, D.OPEN, D.OFF, D.NO_DATA, D.CONTROL} <= resolutions
    assert any("context_bucket" in v for v in out) and any("needs_plain" in v for v in out)
    assert any(v.get("slo_out_of_reach") for v in out) and any("load" in v for v in out)
    for d in out:
        _round_trip(d)


def test_a_deploy_shown_faster_through_another_setting_round_trips():
    fast, cheap = _scenario("suffix", 4, 1.10, (None, None)), _scenario("ngram", 2, 1.05, (None, None))
    vs_plain = {id(fast): RatioInterval(1.10, 1.03, 1.17, 8), id(cheap): RatioInterval(1.05, 0.90, 1.22, 2)}
    pair = {(id(cheap), id(fast)): RatioInterval(0.99, 0.975, 1.01, 6),
            (id(fast), id(cheap)): RatioInterval(1.02, 0.99, 1.047, 6)}
    v = decide_group([cheap, fast], SLO(), D.DecisionGroup("code", 0.0), vs_plain=lambda s, alpha: vs_plain[id(s)],
                     compare=lambda a, b, ia, ib, alpha: pair[(id(a), id(b))])
    assert v.deploys and v.resolved and isinstance(v.shown_through, D.ShownThrough)
    assert v.shown_through.setting == "suffix γ=4" and v.shown_through.bound == pytest.approx(1.00425)
    assert all(isinstance(c, D.Comparison) for c in v.comparisons)
    _round_trip(v.to_dict())


def test_labelled_simulated_and_raced_verdicts_round_trip():
    (v,) = decide([_paired("ngram", 4, PLAIN, [1.3] * 8)])
    v.load, v.simulated = 64, True
    v.simulation_error = D.SimulationError((4,), {"speedup": 0.2}, "simulator vs measured at load 4: speed-up ±20 %")
    v.race_dropped = [D.RaceDrop("suffix γ=2", 6, "more than 5 % slower")]
    d = v.to_dict()
    assert list(d)[-4:] == ["load", "simulated", "simulation_error", "race_dropped"]
    assert d["simulation_error"]["validated_at"] == [4] and d["race_dropped"][0]["after_prompts"] == 6
    _round_trip(d)


def test_the_mix_round_trips_with_its_weights_and_settings():
    r = [1.5, 1.4, 1.6, 1.45, 1.55, 1.5, 1.52, 1.48]
    scenarios = [_paired(d, g, PLAIN, [x * k for x in r], category=c)
                 for c in ("code", "chat") for d, g, k in (("ngram", 2, 1.0), ("suffix", 4, 1.2))]
    (entry,) = mix_decisions(scenarios, SLO())
    assert entry["category"] == "all traffic" and set(entry["weights"]) == {"code", "chat"}
    assert [s["setting"] for s in entry["settings"]] == ["ngram γ=2", "suffix γ=4"]
    _round_trip(entry)


def test_the_readers_properties_and_a_hand_built_dict():
    deploy = Verdict("code", 0.0, decision=D.DEPLOY, resolution=D.OPEN, drafter="ngram", gamma=4)
    assert deploy.deploys and deploy.is_open and not deploy.is_off and not deploy.is_control
    assert deploy.load_or_solo == 1 and Verdict("code", 0.0, load=16).load_or_solo == 16
    assert Verdict("random", 0.0, decision=D.CONTROL, resolution=D.CONTROL).is_control
    assert Verdict("code", 0.0, decision=D.OFF, resolution=D.OFF, resolved=True).is_off
    partial = D.as_verdict({"category": "code", "temperature": 0.0, "load": 4, "decision": "deploy", "drafter": "ngram",
                          "gamma": 2})
    assert (partial.deploys, partial.load, partial.simulated, partial.comparisons) == (True, 4, None, [])
    missing = Verdict.from_dict({"category": "code", "temperature": 0.0})
    assert (missing.decision, missing.resolution, missing.resolved) == (D.NO_DECISION, D.NO_DATA, False)
    assert D.as_verdict(deploy) is deploy
    d = deploy.to_dict()
    assert "needs_plain" not in d and "load" not in d and "repeated_ngram_fraction" not in d
    assert d["speedup_ci"] == [None, None]
