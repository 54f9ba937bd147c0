"""The items a run measures: the user's JSONL workload, or a seeded sample of the built-in categories."""

from __future__ import annotations

from collections.abc import Sequence

from specledger.errors import require
from specledger.workloads.catalog import load_category
from specledger.workloads.item import WorkloadItem
from specledger.workloads.jsonl import load_jsonl
from specledger.workloads.random_tokens import random_token_items


def run_items(categories: Sequence[str], n_per_category: int, seed: int, workload_file: str | None,
              vocab_size: int) -> tuple[list[WorkloadItem], list[str]]:
    """Workload items: built-in categories (seeded, stable; ``random`` = 64 random tokens over
    ``vocab_size``) or the user's JSONL (``workload_file``, then ``categories`` are not used);
    returns (items, warnings)."""
    warnings: list[str] = []
    if workload_file:
        items, warnings = load_jsonl(workload_file)
        require(bool(items), f"{workload_file}: no usable workload items")
        return items, warnings
    items = []
    for c in categories:
        if c == "random":
            items += random_token_items(n_per_category, vocab_size=vocab_size, length=64, seed=seed)
        else:
            items += load_category(c, n_per_category, seed=seed)
    return items, warnings
