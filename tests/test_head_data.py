"""train-head's training data: extra chat questions (train split only), category weights, settings errors."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from specledger.errors import SpecLedgerError
from specledger.headtrain.data import parse_category_weights, weighted_order
from specledger.headtrain.train import Corpus, TrainSettings, choose_draft_vocab, train_head
from specledger.workloads import CATEGORIES, load_category, split_of
from specledger.workloads.chat_questions import chat_training_items
from specledger.workloads.item import WorkloadItem
from tests.conftest import tiny_model
from tests.test_head import _Loaded

BENCH_PROMPTS = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "dialogue_heldout.jsonl"


def _items(counts: dict[str, int]) -> list[WorkloadItem]:
    return [WorkloadItem(id=f"{c}/{i}", category=c, messages=None, prompt=f"{c} {i}")
            for c, n in counts.items() for i in range(n)]


def test_chat_questions_are_train_split_dialogue_and_never_a_measured_prompt():
    chat = chat_training_items()
    assert len(chat) > 500
    assert all(item.category == "dialogue" and split_of(item) == "train" for item in chat)
    texts = [item.text.lower() for item in chat]
    assert len(set(texts)) == len(texts) and len({item.id for item in chat}) == len(chat)
    measured = {item.text.lower() for c in CATEGORIES if c != "random" for item in load_category(c, 10_000)}
    bench = {json.loads(line)["messages"][-1]["content"].lower() for line in BENCH_PROMPTS.read_text().splitlines()
             if line.strip()}
    assert not (set(texts) & measured) and not (set(texts) & bench)


def test_weighted_order_without_weights_is_one_seeded_shuffle():
    items = _items({"math": 30, "dialogue": 5})
    expected = list(items)
    random.Random(7).shuffle(expected)
    assert weighted_order(items, None, 7) == expected


def test_weighted_order_keeps_every_prefix_in_proportion_until_a_category_runs_out():
    items = _items({"math": 100, "dialogue": 40, "code": 10, "agent": 20})
    order = weighted_order(items, {"dialogue": 4, "math": 1, "agent": 0}, seed=3)
    assert not any(item.category == "agent" for item in order)  # weight 0 drops it
    assert len(order) == 150 and len({item.id for item in order}) == 150
    head = Counter(item.category for item in order[:30])  # dialogue 4 : math 1 : code 1 (unnamed)
    assert head == {"dialogue": 20, "math": 5, "code": 5}
    assert Counter(item.category for item in order[-50:]) == {"math": 50}  # the others ran out first
    assert order == weighted_order(items, {"dialogue": 4, "math": 1, "agent": 0}, seed=3)
    assert order != weighted_order(items, {"dialogue": 4, "math": 1, "agent": 0}, seed=4)


def test_category_weights_parse_and_refuse_bad_input_in_one_line():
    assert parse_category_weights("dialogue=8, math=0.5,") == {"dialogue": 8.0, "math": 0.5}
    for bad, why in (("dialog=2", "unknown category"), ("math", "CATEGORY=WEIGHT"), ("math=x", "not a number"),
                     ("math=-1", ">= 0"), ("random=1", "unknown category")):
        with pytest.raises(SpecLedgerError, match=why) as err:
            parse_category_weights(bad)
        assert "\n" not in str(err.value)
    for settings in (TrainSettings(extra_chat=-1), TrainSettings(weight_decay=-0.1), TrainSettings(max_batch=0),
                     TrainSettings(category_weights={"math": 0.0})):
        with pytest.raises(SpecLedgerError):
            settings.validate()


def test_train_head_answers_follow_the_weights_and_take_the_extra_chat(tmp_path):
    target = tiny_model(2, vocab=96)
    settings = TrainSettings(minutes=5, categories=["math", "code"], extra_chat=12, max_new_tokens=8,
                             draft_vocab=0, hidden_dim=16, window=16, max_prompts=12, max_steps=2,
                             max_prefill_prompts=4, prefill_max_tokens=64, max_prompt_tokens=400,
                             category_weights={"dialogue": 2, "math": 1, "code": 0}, check_every=1,
                             prompt_loss_weight=0.2)
    figures = train_head(_Loaded(target), settings, tmp_path / "h.safetensors")
    assert figures["answers_by_category"] == {"dialogue": 8, "math": 4}
    assert sum(figures["prefill_by_category"].values()) == 4 and "code" not in figures["prefill_by_category"]
    assert [c[0] for c in figures["checkpoints"]] == [1, 2] and figures["best_step"] in (1, 2)


def test_the_draft_vocabulary_fills_up_from_the_prompts_token_counts_before_unseen_ids():
    corpus = Corpus(labels=[torch.tensor([5, 5, 6, 7])])
    ids = choose_draft_vocab(corpus, 6, [2], 50, fill=Counter({40: 9, 6: 8, 30: 1}))
    assert ids.tolist() == [2, 5, 6, 7, 30, 40]  # labels by count, then the prompts' counts
    assert choose_draft_vocab(corpus, 7, [2], 50, fill=Counter({40: 9})).tolist() == [0, 1, 2, 5, 6, 7, 40]
    assert choose_draft_vocab(corpus, 0, [2], 50) is None
    with pytest.raises(SpecLedgerError, match="prompt-loss-weight"):
        TrainSettings(prompt_loss_weight=-1).validate()
