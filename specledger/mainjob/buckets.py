"""Deciding per context bucket: which categories a run splits by prompt length, and their initial prompts.

A category is *bucketed* when its candidate prompts (a workload file's lines, or the first
:data:`CANDIDATES` items of a built-in category's seeded order) that fit the prompt budget fall in two or
more context buckets (:mod:`specledger.workloads.context_buckets`) with at least ``n`` prompts each. Its items
then carry the decision key ``"<category>@<bucket>"`` as their category (and ``meta["context_bucket"]``), so
the race, the verdicts, the schedule and the report decide each bucket on its own prompts; a category in one
bucket keeps its name. The split depends on the prompts' token counts only (the target's tokenizer), never on
a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from specledger.workloads.context_buckets import BUCKETS, bucket_key, bucket_of, split_key

if TYPE_CHECKING:
    from specledger.workloads.item import WorkloadItem

#: built-in items looked at per category to find its buckets
CANDIDATES = 64
#: the built-in categories that may be split: the long-input one (the others' prompts are short by design, so
#: splitting them would spend the budget on a few outliers); a workload file's categories all may
BUCKETED_BUILTIN = ("long",)


def buckets_with(lengths: Sequence[int], n: int) -> list[str]:
    """The buckets holding at least ``n`` of ``lengths``, in bucket order."""
    counts = {b: 0 for b in BUCKETS}
    for length in lengths:
        counts[bucket_of(length)] += 1
    return [b for b in BUCKETS if counts[b] >= max(1, n)]


def nearest(bucket: str, buckets: Sequence[str]) -> str:
    """``bucket`` if it is one of ``buckets``, else the one of them nearest in length order (a prompt whose own
    bucket holds too few prompts to be decided joins its neighbour)."""
    return min(buckets, key=lambda b: abs(BUCKETS.index(b) - BUCKETS.index(bucket)))


def bucketed_item(item: WorkloadItem, bucket: str) -> WorkloadItem:
    """A copy of ``item`` whose category is its bucket's decision key (``"long@2-4k"``)."""
    return replace(item, category=bucket_key(split_key(item.category)[0], bucket),
                   meta={**item.meta, "context_bucket": bucket})


def split_initial(items: Sequence[WorkloadItem], candidates: dict[str, Sequence[WorkloadItem]],
                  length_of: Callable[[WorkloadItem], int | None], n: int, keep_all: bool = False
                  ) -> tuple[list[WorkloadItem], dict[str, list[str]]]:
    """(initial items, {category: its buckets}) for the bucketed categories among ``candidates``
    (category -> its items in sampling order): ``n`` prompts per bucket, the first of each in order (with
    ``keep_all``: every candidate, in its bucket or, where that holds fewer than ``n``, the nearest that does);
    the other categories' ``items`` are kept as they are.
    ``length_of`` gives a prompt's token count, None when it does not fit the prompt budget."""
    bucketed: dict[str, list[str]] = {}
    chosen: dict[str, list[WorkloadItem]] = {}
    for category, pool in candidates.items():
        sized = [(it, length) for it in pool if (length := length_of(it)) is not None]
        buckets = buckets_with([length for _, length in sized], n)
        if len(buckets) < 2:
            continue
        bucketed[category] = buckets
        chosen[category] = [bucketed_item(it, nearest(bucket_of(length), buckets)) for it, length in sized] \
            if keep_all else \
            [bucketed_item(it, b) for b in buckets for it in [it for it, length in sized if bucket_of(length) == b][:n]]
    out = [it for it in items if it.category not in bucketed]
    for category in bucketed:
        out += chosen[category]
    return out, bucketed
