"""train-head's prompts: the workloads' TRAIN split, extra chat questions, and the order they are read in.

Only ``train``-split items are ever returned (:func:`specledger.workloads.training_items` and
:func:`specledger.workloads.chat_questions.chat_training_items`), so no prompt a run measures is
trained on. The order matters because the generate phase is time-bounded: it answers the
prompts in this order until its share of the budget ends, so the category weights decide how
much of the generated corpus each category gets.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from specledger.errors import SpecLedgerError, require


def training_prompt_items(categories: Sequence[str] | None, extra_chat: int, weights: dict[str, float] | None,
                          seed: int) -> list[Any]:
    """TRAIN-split items of ``categories`` plus up to ``extra_chat`` chat questions (a seeded sample),
    in :func:`weighted_order`."""
    from specledger.workloads import training_items
    from specledger.workloads.chat_questions import chat_training_items

    items = training_items(categories)
    if extra_chat:
        chat = chat_training_items()
        random.Random(seed).shuffle(chat)
        items += chat[:extra_chat]
    return weighted_order(items, weights, seed)


def parse_category_weights(text: str) -> dict[str, float]:
    """``"dialogue=8,math=0.5"`` -> ``{"dialogue": 8.0, "math": 0.5}``; one-line errors for a
    malformed pair, an unknown category or a negative weight."""
    from specledger.workloads import CATEGORIES

    weights: dict[str, float] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        name = name.strip()
        require(sep == "=", f"--category-weights: expected CATEGORY=WEIGHT, got {pair!r}")
        require(name in CATEGORIES and name != "random",
                f"--category-weights: unknown category {name!r}; choose from "
                f"{', '.join(c for c in CATEGORIES if c != 'random')}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise SpecLedgerError(f"--category-weights: {name}'s weight {value!r} is not a number") from None
        require(weights[name] >= 0, f"--category-weights: {name}'s weight must be >= 0, got {value}")
    return weights


def weighted_order(items: Sequence[Any], weights: dict[str, float] | None, seed: int) -> list[Any]:
    """The order the phases read training prompts in. ``weights`` None: one seeded shuffle (each
    category's share = its share of the items). Else each category is shuffled (seeded) and the
    categories are interleaved so that every prefix holds them in proportion to their weights
    (stride scheduling: next is the category with the smallest ``(taken + 0.5) / weight``, ties by
    name; a category not named weighs 1, weight 0 drops it); one that runs out leaves the rest."""
    rnd = random.Random(seed)
    if weights is None:
        order = list(items)
        rnd.shuffle(order)
        return order
    groups: dict[str, list[Any]] = {}
    for item in items:
        groups.setdefault(item.category, []).append(item)
    for name in sorted(groups):
        rnd.shuffle(groups[name])
    live = {c: float(weights.get(c, 1.0)) for c in groups if weights.get(c, 1.0) > 0}
    taken = dict.fromkeys(live, 0)
    order = []
    while live:
        c = min(sorted(live), key=lambda k: (taken[k] + 0.5) / live[k])
        order.append(groups[c][taken[c]])
        taken[c] += 1
        if taken[c] == len(groups[c]):
            del live[c]
    return order


def encode_items(loaded: Any, items: Sequence[Any], max_prompt_tokens: int | None) -> list[tuple[str, list[int]]]:
    """``(category, prompt token ids)`` of the items, in order, skipping any the template refuses
    and (when ``max_prompt_tokens`` is given) any longer than that."""
    from specledger.workloads import encode_item

    prompts = []
    for item in items:
        if item.meta.get("token_ids"):
            continue
        try:
            ids = encode_item(loaded, item)
        except Exception:  # an item the template refuses is skipped, not fatal
            continue
        if len(ids) > 0 and (max_prompt_tokens is None or len(ids) <= max_prompt_tokens):
            prompts.append((item.category, ids))
    return prompts
