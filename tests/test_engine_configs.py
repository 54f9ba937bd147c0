"""Engine configs from a per-load schedule: every emitted config passes the rules its engine's own
config code enforces (vLLM, TensorRT-LLM, SGLang, llama.cpp), the loads between measured points follow
the stated rule, and the forms engines reject (vLLM's old dict schedule, a TRT entry for 1 below the
maximum) fail their validators."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.gates.engine_configs import (
    DEFAULT_MAX_LOAD,
    DrafterDetails,
    batch_ranges,
    engine_configs,
    help_flags,
    pick_drafter,
    unknown_flags,
    validate_llama_cpp,
    validate_sglang,
    validate_trtllm,
    validate_vllm,
)

VALIDATORS = {"vllm": validate_vllm, "trtllm": validate_trtllm, "sglang": validate_sglang,
              "llama_cpp": validate_llama_cpp}

SCHEDULES = {
    "all-on": {1: ("ngram", 4), 4: ("ngram", 4), 16: ("ngram", 4)},
    "off-at-high-loads": {1: ("ngram", 4), 4: ("ngram", 2), 16: None, 64: ("ngram", 0)},
    "single-load": {1: ("suffix", 3)},
    "drafter-switch": {1: ("model", 4), 4: ("model", 3), 16: ("ngram", 2), 64: None},
    "layerskip": {1: ("layerskip", 2), 16: None},
    "quant-self": {1: ("quant-self", 3)},
    "head": {1: ("head", 3), 8: ("head", 2)},
    "off-at-1": {1: None, 4: ("ngram", 2)},
    "rising": {1: ("ngram", 2), 4: ("ngram", 4)},
    "all-off": {1: None, 16: None},
}


def _k_at(ranges, b):
    return next(k for a, e, k in ranges if a <= b <= e)


def _check_all(cfg):
    """Every config the writer emitted passes its validator, also after a JSON round trip."""
    for key, check in VALIDATORS.items():
        if cfg[key] is not None:
            check(cfg[key])
            check(json.loads(json.dumps(cfg[key])))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_emitted_config_passes_its_validator(name):
    cfg = engine_configs(SCHEDULES[name])
    _check_all(cfg)
    assert cfg["note"]  # every schedule says something: what is missing, what to replace, or "off"


def test_ranges_follow_the_stated_rule_between_measured_loads():
    cfg = engine_configs(SCHEDULES["off-at-high-loads"])
    # (0, 1] -> k(1) = 4, (1, 4] -> k(4) = 2, (4, 16] off, (16, 64] off, above 64 off
    assert cfg["ranges"] == [[1, 1, 4], [2, 4, 2], [5, DEFAULT_MAX_LOAD, 0]]
    spec = cfg["vllm"]
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 4
    assert spec["num_speculative_tokens_per_batch_size"] == cfg["ranges"]
    assert spec["prompt_lookup_min"] == 1 and spec["prompt_lookup_max"] == 3
    trt = cfg["trtllm"]["speculative_config"]
    assert trt["draft_len_schedule"] == {1: 4, 4: 2} and trt["max_draft_len"] == 4
    # SGLang / llama.cpp: one γ per server, capped at the loads that were on from 1
    sg = cfg["sglang"]
    assert sg[sg.index("--max-running-requests") + 1] == "4"
    assert sg[sg.index("--speculative-num-draft-tokens") + 1] == "5"
    ll = cfg["llama_cpp"]
    assert ll[ll.index("--spec-ngram-simple-size-m") + 1] == "4" and ll[ll.index("--spec-type") + 1] == "ngram-simple"
    assert ll[ll.index("--parallel") + 1] == "4" and cfg["gamma"] == 4 and cfg["drafter"] == "ngram"


def test_loads_above_the_largest_measured_are_off_and_the_tail_is_explicit():
    cfg = engine_configs(SCHEDULES["all-on"])
    assert cfg["ranges"] == [[1, 16, 4], [17, DEFAULT_MAX_LOAD, 0]]
    # vLLM carries the last range's k past it: a final k = 0 range is what stops speculation there
    assert cfg["vllm"]["num_speculative_tokens_per_batch_size"][-1][2] == 0
    assert batch_ranges({1: 4, 16: 4}, max_load=16) == [[1, 16, 4]]
    assert batch_ranges({1: 4, 2000: 2}) == [[1, 1, 4], [2, 2000, 2], [2001, 2001, 0]]


def test_one_drafter_per_deployment():
    cfg = engine_configs(SCHEDULES["drafter-switch"])
    assert cfg["drafter"] == "model" and cfg["gamma_by_load"] == {1: 4, 4: 3, 16: 0, 64: 0}
    assert "loads using ngram are off here" in cfg["note"]
    assert cfg["vllm"]["method"] == "draft_model"
    assert pick_drafter(SCHEDULES["drafter-switch"], prefer_load=16) == "ngram"
    assert engine_configs(SCHEDULES["drafter-switch"], prefer_load=16)["ranges"] == [
        [1, 4, 0], [5, 16, 2], [17, DEFAULT_MAX_LOAD, 0]]


def test_drafters_an_engine_lacks_get_a_note_not_an_invented_method():
    for name in ("layerskip", "quant-self"):
        cfg = engine_configs(SCHEDULES[name])
        assert all(cfg[k] is None for k in VALIDATORS), name
        assert "vLLM has no speculative method" in cfg["note"]
    suffix = engine_configs(SCHEDULES["single-load"])
    assert suffix["vllm"]["method"] == "suffix"
    assert suffix["trtllm"] is None and suffix["sglang"] is None and suffix["llama_cpp"] is None


def test_the_head_maps_to_eagle():
    cfg = engine_configs(SCHEDULES["head"], details=DrafterDetails(model="me/eagle-head"))
    assert cfg["vllm"]["method"] == "eagle"
    assert cfg["vllm"]["model"] == "me/eagle-head"
    assert cfg["trtllm"]["speculative_config"]["decoding_type"] == "Eagle3"
    assert cfg["sglang"][:2] == ["--speculative-algorithm", "EAGLE"]
    assert cfg["llama_cpp"][:4] == ["--spec-type", "draft-eagle3", "-md", "me/eagle-head"]
    tree = engine_configs(SCHEDULES["head"], details=DrafterDetails(eagle3=True, tree_budget=8, tree_topk=4))
    _check_all(tree)
    assert tree["vllm"]["method"] == "eagle3"
    sg = tree["sglang"]
    assert sg[sg.index("--speculative-eagle-topk") + 1] == "4" and sg[sg.index("--speculative-num-draft-tokens")
                                                                       + 1] == "9"
    assert "DRAFT_MODEL_PATH" in tree["note"]  # no checkpoint given: says what to replace


def test_schedules_trt_cannot_express_are_left_out_with_the_reason():
    for name in ("rising", "off-at-1"):
        cfg = engine_configs(SCHEDULES[name])
        assert cfg["trtllm"] is None and "largest draft length at the smallest batch" in cfg["note"]
        assert cfg["vllm"] is not None


def test_off_everywhere_has_no_config():
    cfg = engine_configs(SCHEDULES["all-off"])
    assert all(cfg[k] is None for k in VALIDATORS) and "off at every load" in cfg["note"]
    policy = engine_configs({1: ("ngram", "goodput")})
    assert policy["vllm"] is None and "γ policy" in policy["note"]


# ------------------------------------------------------------------------ what the engines reject
def _vllm(**kw):
    return {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1, **kw}


@pytest.mark.parametrize("bad, message", [
    ({"num_speculative_tokens_per_batch_size": {"1": 2, "16": 0, "64": 0}}, "non-empty list"),  # the old form
    ({"num_speculative_tokens_per_batch_size": []}, "non-empty list"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4]]}, "is not"),
    ({"num_speculative_tokens_per_batch_size": [[2, 4, 2]]}, "start at 1"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4, 2], [4, 8, 0]]}, "overlap"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4, 2], [6, 8, 0]]}, "5–5 are in no range"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4, -1]]}, "k >= 0"),
    ({"num_speculative_tokens_per_batch_size": [[4, 1, 2]]}, "start <= end"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4, 3]]}, "clamps"),
    ({"method": "layerskip"}, "not a vLLM speculative method"),
    ({"num_speculative_tokens": 0}, "> 0"),
    ({"prompt_lookup_min": 4}, "prompt_lookup_min <= prompt_lookup_max"),
    ({"method": "draft_model"}, "needs model"),
    ({"num_speculative_tokens_per_batch_sizes": []}, "unknown key"),
])
def test_vllm_validator_rejects_what_vllm_rejects(bad, message):
    with pytest.raises(SpecLedgerError, match=message) as err:
        validate_vllm(_vllm(**bad))
    assert "\n" not in str(err.value)


def test_the_old_schedule_writer_output_fails_validate_vllm():
    old = {"method": "ngram", "num_speculative_tokens": 2,
           "num_speculative_tokens_per_batch_size": {"1": 2, "16": 0, "64": 0}}
    with pytest.raises(SpecLedgerError, match="num_speculative_tokens_per_batch_size"):
        validate_vllm(old)
    with pytest.raises(SpecLedgerError, match="takes the config itself"):  # --speculative-config takes no wrapper
        validate_vllm({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}})
    with pytest.raises(SpecLedgerError, match="not a vLLM speculative method"):
        validate_vllm({"method": "layerskip", "num_speculative_tokens": 2})  # the old writer's layerskip


def _trt(sched, **kw):
    return {"decoding_type": "NGram", "max_draft_len": 4, "draft_len_schedule": sched, **kw}


@pytest.mark.parametrize("bad, message", [
    (_trt({1: 2, 4: 4}), r"draft_len_schedule\[1\] = 2 must equal max_draft_len = 4"),
    (_trt({4: 4, 16: 2}), "must include batch size 1"),
    (_trt({0: 4, 1: 4}), ">= 1"),
    (_trt({1: 4, 8: -1}), ">= 0"),
    (_trt({1: 4, 8: 5}), "exceeds max_draft_len"),
    (_trt({1: 4}, max_concurrency=8), "mutually exclusive"),
    (_trt({}), "non-empty"),
    ({"decoding_type": "Eagle3", "max_draft_len": 4, "draft_len_schedule": {1: 4}}, "speculative_model"),
    ({"decoding_type": "LayerSkip", "max_draft_len": 4}, "decoding_type"),
])
def test_trtllm_validator_rejects_what_trtllm_rejects(bad, message):
    with pytest.raises(SpecLedgerError, match=message):
        validate_trtllm(bad)


def test_trtllm_accepts_json_string_keys():
    validate_trtllm({"speculative_config": _trt({"1": 4, "16": 2})})


@pytest.mark.parametrize("bad, message", [
    (["--speculative-algorithm", "LAYERSKIP"], "not one of"),
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "3"], "num_steps \\+ 1 = 4"),
    (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"], "need --speculative-num-steps"),
    (["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3"], "draft-model-path"),
    (["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "0"], ">= 1"),
    (["--speculative-algorithm", "NGRAM", "--speculative-ngram-min-match-window-size", "4",
      "--speculative-ngram-max-match-window-size", "3"], "min match window"),
    (["--speculative-algorithm", "NGRAM", "--max-running-requests"], "needs a value"),
    (["--speculative-algorithm", "NGRAM", "--speculative-algorithm", "NGRAM"], "twice"),
])
def test_sglang_validator(bad, message):
    with pytest.raises(SpecLedgerError, match=message):
        validate_sglang(bad)


@pytest.mark.parametrize("bad, message", [
    (["--spec-type", "suffix"], "not one of"),
    (["--spec-draft-n-max", "4"], "needs -md"),
    (["--spec-type", "draft-simple", "--spec-draft-n-max", "4"], "needs -md"),
    (["--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "2", "--spec-draft-n-min", "3"],
     "--spec-draft-n-min 3 > --spec-draft-n-max 2"),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "0"], ">= 1"),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2000"], "<= 1024"),
    # the flags llama-server of llama-cpp-python 0.3.36 rejects ("the argument has been removed")
    (["--spec-type", "ngram-simple", "--spec-ngram-size-n", "3"], "removed.*--spec-ngram-simple-size-n"),
    (["--spec-type", "ngram-simple", "--draft-max", "2"], "removed.*--spec-draft-n-max"),
    (["-md", "d.gguf", "--draft-min", "0"], "removed.*--spec-draft-n-min"),
])
def test_llama_cpp_validator(bad, message):
    with pytest.raises(SpecLedgerError, match=message):
        validate_llama_cpp(bad)


# ------------------------------------------------------------------------------------ any schedule
SETTING = st.one_of(st.none(), st.tuples(st.sampled_from(["ngram", "suffix", "model", "head", "layerskip",
                                                          "quant-self"]), st.integers(0, 8)))


@given(st.dictionaries(st.integers(1, 512), SETTING, min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(1, 2048)), st.booleans())
def test_any_schedule_gives_valid_configs_that_follow_the_rule(schedule, max_load, eagle3):
    cfg = engine_configs(schedule, max_load, details=DrafterDetails(eagle3=eagle3))
    _check_all(cfg)
    ranges, ks = cfg["ranges"], cfg["gamma_by_load"]
    top = max(DEFAULT_MAX_LOAD, max(schedule) + 1) if max_load is None else max_load
    assert ranges[0][0] == 1 and ranges[-1][1] == top
    for (_, e, k), (b, _, k2) in zip(ranges, ranges[1:]):
        assert b == e + 1 and k != k2  # contiguous, merged
    loads = sorted(ks)
    for b in {1, top, *[c for c in loads if c <= top], *[c + 1 for c in loads if c < top]}:
        above = [c for c in loads if c >= b]
        assert _k_at(ranges, b) == (ks[above[0]] if above else 0)  # decided by the next measured load up
    if cfg["vllm"]:
        spec = cfg["vllm"]
        assert spec["num_speculative_tokens_per_batch_size"] == ranges
        assert spec["num_speculative_tokens"] == max(k for _, _, k in ranges)
    if cfg["trtllm"]:
        sched = cfg["trtllm"]["speculative_config"]["draft_len_schedule"]
        for b in range(1, min(top, 600) + 1):  # TRT's lookup: the first key >= b, 0 above the largest
            key = min((c for c in sched if c >= b), default=None)
            assert (sched[key] if key is not None else 0) == _k_at(ranges, b)


# ------------------------------------------------------------------ a llama-server's own --help
HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
-np,   --parallel N                     number of server slots (default: -1)
                                        (env: LLAMA_ARG_N_PARALLEL)
--spec-type [none|draft-simple|draft-eagle3|ngram-simple]
                                        comma-separated list of types of speculative decoding to use
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
-md,   --spec-draft-model, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-ngram-simple-size-n N            ngram size N for ngram-simple speculative decoding (default: 12)
--spec-ngram-simple-size-m N            ngram size M for ngram-simple speculative decoding (default: 48)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
--spec-ngram-size-n N                   the argument has been removed. use the respective
                                        --spec-ngram-*-size-n or --spec-ngram-mod-n-match
"""


def test_help_flags_lists_every_spelling_but_the_removed_ones():
    flags = help_flags(HELP)
    assert {"-h", "--help", "--usage", "-np", "--parallel", "--spec-type", "--spec-draft-n-max", "-md",
            "--spec-draft-model", "--model-draft", "--spec-ngram-simple-size-n"} <= flags
    assert not {"--draft", "--draft-n", "--draft-max", "--spec-ngram-size-n"} & flags
    assert "--spec-ngram-mod-n-max" not in flags  # a flag named inside a description is not offered
    assert unknown_flags(["--spec-type", "ngram-simple", "--draft-max", "4", "--parallel=2", "-1"], flags) == [
        "--draft-max"]


def test_flags_a_binary_lacks_are_not_emitted():
    old_binary = help_flags(HELP.replace("--spec-ngram-simple-size-m N", "--other N"))
    cfg = engine_configs({1: ("ngram", 4), 16: None}, llama_flags=old_binary)
    assert cfg["llama_cpp"] is None and "lacks --spec-ngram-simple-size-m" in cfg["note"]
    assert cfg["vllm"] is not None  # the other engines are not this binary's business
    ok = engine_configs({1: ("ngram", 4), 16: None}, llama_flags=help_flags(HELP))
    assert ok["llama_cpp"] == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                               "--spec-ngram-simple-size-m", "4", "--parallel", "1"]
    assert ok["gamma"] == 4 and set(ok["versions"]) == {"vllm", "trtllm", "sglang", "llama_cpp"}
    assert "0.3.36" in ok["versions"]["llama_cpp"] and "0.24" in ok["versions"]["vllm"]


def test_the_vllm_config_is_the_value_of_speculative_config():
    cfg = engine_configs({1: ("ngram", 4), 16: ("ngram", 2)})
    assert set(cfg["vllm"]) >= {"method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    assert "speculative_config" not in cfg["vllm"] and "--speculative-config" in cfg["notes"]["vllm"]
    assert set(cfg["trtllm"]) == {"speculative_config"}  # TensorRT-LLM's --extra_llm_api_options file holds it so


def test_a_binary_at_hand_is_asked_once_and_its_flags_checked(tmp_path, monkeypatch):
    """``binary_flags`` runs ``PROGRAM --help`` (cached per binary file); a launched llama.cpp command with a flag
    that binary lacks is not emitted, and its note says which."""
    from specledger.probe.engine_command import binary_flags, check_engine_command

    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\ncat <<'EOF'\n" + HELP + "EOF\n")
    program.chmod(0o755)
    assert binary_flags(program) == help_flags(HELP)
    assert binary_flags(tmp_path / "missing") is None
    from specledger.probe.engine_command import LLAMA_SERVER_ENV, llama_flags_at_hand

    monkeypatch.setenv(LLAMA_SERVER_ENV, str(program))  # what summary.json's schedules are checked against
    assert llama_flags_at_hand() == help_flags(HELP)
    monkeypatch.delenv(LLAMA_SERVER_ENV)
    assert llama_flags_at_hand() is None
    good = {"kind": "llama.cpp", "argv": [str(program), "--spec-type", "ngram-simple", "--parallel", "2"],
            "command": "x", "note": "pays"}
    check_engine_command(good)
    assert good["command"] == "x"
    bad = {"kind": "llama.cpp", "argv": [str(program), "--spec-ngram-size-n", "3"], "command": "x", "note": "pays"}
    check_engine_command(bad)
    assert bad["argv"] is None and bad["command"] is None and "does not offer --spec-ngram-size-n" in bad["note"]
