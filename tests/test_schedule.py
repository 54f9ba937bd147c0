"""The verdict as a per-load schedule, its vLLM / TensorRT-LLM snippets, and target-load checks."""

from __future__ import annotations

import json
import math

import pytest

from specledger.errors import SpecLedgerError
from specledger.gates import SLO, check_target_load, slo_from_dict
from specledger.gates.engine_configs import (
    validate_llama_cpp,
    validate_sglang,
    validate_trtllm,
    validate_vllm,
)
from specledger.gates.schedule import schedule_text, schedules, snippet


def _v(load, drafter=None, gamma=None, simulated=False, category="code"):
    return {"category": category, "temperature": 0.0, "load": load, "simulated": simulated,
            "decision": "deploy" if drafter else "off", "drafter": drafter, "gamma": gamma}


def test_schedule_merges_runs_and_emits_snippets():
    cells = [_v(1, "ngram", 4), _v(4, "ngram", 4), _v(16, "ngram", 2), _v(64, simulated=True)]
    (s,) = schedules(cells, target_load=16)
    assert s["text"] == ("ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim) (between 4 and 16, not located "
                         "within 2×: configs switch at 5; between 16 and 64, not located within 2×: at 17)")
    assert s["at_target"]["load"] == 16
    spec = s["vllm"]  # the value vllm serve --speculative-config takes, not wrapped
    assert snippet(s, "vllm") == f"--speculative-config '{json.dumps(spec)}'"
    # vLLM's list of [start, end, k]: each load decides the batch sizes down to the load below it
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 16, 2], [17, 1024, 0]]
    assert spec["num_speculative_tokens"] == 4 and spec["method"] == "ngram"
    validate_vllm(s["vllm"])
    trt = json.loads(snippet(s, "trtllm"))["speculative_config"]
    assert trt["draft_len_schedule"] == {"1": 4, "4": 4, "16": 2} and trt["max_draft_len"] == 4
    validate_trtllm(trt)
    validate_sglang(s["sglang"])
    validate_llama_cpp(s["llama_cpp"])
    assert snippet(s, "sglang").startswith("--speculative-algorithm NGRAM")
    assert s["ranges"] == spec["num_speculative_tokens_per_batch_size"] and s["configs_note"]
    # the answer as keys: the one drafter, the one-γ servers' draft length, every load's decision
    assert s["drafter"] == "ngram" and s["gamma"] == 4 and set(s["versions"]) == {"vllm", "trtllm", "sglang",
                                                                                 "llama_cpp"}
    assert [(d["load"], d["decision"], d["drafter"], d["gamma"], d["simulated"], d["engine_gamma"])
            for d in s["decisions"]] == [(1, "deploy", "ngram", 4, False, 4), (4, "deploy", "ngram", 4, False, 4),
                                         (16, "deploy", "ngram", 2, False, 2), (64, "off", None, None, True, 0)]
    assert [d["setting"] for d in s["decisions"]] == ["ngram γ=4", "ngram γ=4", "ngram γ=2", "off"]


def test_every_decision_but_deploy_is_off_and_one_drafter_per_deployment():
    cells = [_v(1, "suffix", 4), {**_v(4, "ngram", 2), "decision": "no-decision"}, _v(16, "ngram", 2)]
    (s,) = schedules(cells)
    assert s["vllm"]["method"] == "suffix"  # the lowest deploying load's drafter
    assert [d["engine_gamma"] for d in s["decisions"]] == [4, 0, 0]  # the other drafter's load is off here
    assert s["ranges"] == [[1, 1, 4], [2, 1024, 0]]  # "no-decision" at 4 is off, ngram at 16 is off
    assert "also uses ngram" in s["note"] and s["trtllm"] is None and "TensorRT-LLM" in s["configs_note"]
    (t,) = schedules(cells, target_load=16)
    assert t["ranges"] == [[1, 4, 0], [5, 16, 2], [17, 1024, 0]]  # the target load's drafter
    (ls,) = schedules([_v(1, "layerskip", 2)])
    assert ls["vllm"] is None and "vLLM has no speculative method for layerskip" in ls["configs_note"]


def test_off_everywhere_and_controls_have_no_snippet():
    (s,) = schedules([_v(1), _v(16)])
    assert s["text"] == "off at 1–16" and s["vllm"] is None and snippet(s, "vllm").startswith("#")
    assert s["drafter"] is None and s["gamma"] == 0 and [d["decision"] for d in s["decisions"]] == ["off", "off"]
    assert s["sglang"] is None and snippet(s, "llama_cpp").startswith("#")
    ctrl = {**_v(1), "decision": "control", "category": "random"}
    (c,) = schedules([ctrl])
    assert c["control"] and c["text"] == "control, never deployed" and c["trtllm"] is None


def test_schedule_text_solo_differs_from_load():
    assert schedule_text([_v(1, "suffix", 4), _v(16)]) == ("suffix γ=4 at 1, off from 16 (between 1 and 16, not "
                                                           "located within 2×: configs switch at 2)")


def test_schedule_text_marks_simulated_loads():
    cells = [_v(1, "ngram", 4), _v(16, "ngram", 4), _v(64, "ngram", 4, True), _v(256, "ngram", 4, True)]
    assert schedule_text(cells) == "ngram γ=4 at 1–16 and 64–256 (sim)"
    assert (schedule_text([_v(1, "ngram", 4), _v(16), _v(64, simulated=True)])
            == "ngram γ=4 at 1, off from 16 (measured to 16, simulated from 64) (between 1 and 16, not located "
               "within 2×: configs switch at 2)")
    assert schedule_text([_v(1), _v(64, simulated=True)]) == "off at 1 and 64 (sim)"
    assert schedule_text([_v(1, "ngram", 2), _v(64, "suffix", 4, True)]).startswith(
        "ngram γ=2 at 1, suffix γ=4 at 64 (sim) (between 1 and 64")


def test_the_line_says_where_each_change_lies_and_agrees_with_the_ranges():
    # bisected 1..16: on at 1, 2, 4; off at 8, 16: the change lies between 4 and 8, and every config switches at 5
    cells = [_v(1, "ngram", 2), _v(2, "ngram", 2), _v(4, "ngram", 2), _v(8), _v(16)]
    (s,) = schedules(cells)
    assert s["text"] == "ngram γ=2 at 1–4, off from 8 (between 4 and 8: configs switch at 5)"
    assert s["ranges"] == [[1, 4, 2], [5, 1024, 0]]
    vllm, trt = (s[k].get("speculative_config", s[k]) for k in ("vllm", "trtllm"))  # wrapped or the bare value
    assert vllm["num_speculative_tokens_per_batch_size"] == s["ranges"]
    assert {int(k): v for k, v in trt["draft_len_schedule"].items()} == {1: 2, 4: 2}
    assert s["sglang"][-2:] == ["--max-running-requests", "4"] and s["llama_cpp"][-2:] == ["--parallel", "4"]
    assert s["crossovers"] == [{"between": [4, 8], "from": "ngram γ=2", "to": "off", "located": True,
                                "configs_switch_at": 5, "simulated": False}]
    # adjacent loads: nothing between them to place
    assert schedule_text([_v(1, "ngram", 2), _v(2)]) == "ngram γ=2 at 1, off from 2"


def test_target_load_checks_are_one_line_errors():
    assert slo_from_dict({"target_load": 16}).target_load == 16
    for bad in (-1, 0, 2.5, math.nan, "16", True):
        with pytest.raises(SpecLedgerError, match="target_load"):
            slo_from_dict({"target_load": bad})
    with pytest.raises(SpecLedgerError, match="unknown SLO key"):
        slo_from_dict({"target_loads": 16})
    with pytest.raises(SpecLedgerError, match="ttft_p99_ms"):
        slo_from_dict({"ttft_p99_ms": math.nan})
    check_target_load(SLO(target_load=16), [1, 4, 16])
    check_target_load(SLO(target_load=64), [1, 4, 16], simulated=[64])
    with pytest.raises(SpecLedgerError) as err:
        check_target_load(SLO(target_load=32), [1, 4, 16])
    msg = str(err.value)
    assert "\n" not in msg and "not measured (loads 1, 4, 16)" in msg and "--loads" in msg
