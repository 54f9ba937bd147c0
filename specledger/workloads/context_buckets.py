"""Context buckets: the second axis of a decision (chapter §5.2), from a prompt's length in tokens.

Edges are powers of two (:data:`BUCKET_EDGES`, tokens): ``<1k`` (under 1,024), ``1-2k``, ``2-4k``, ``4-8k``,
``>=8k``. A run decides per (category, bucket) where a category's prompts fall in two or more buckets; a category
whose prompts all fall in one bucket keeps one decision, labelled with that bucket.
"""

from __future__ import annotations

from typing import Literal, get_args

BUCKET_EDGES: tuple[int, ...] = (1024, 2048, 4096, 8192)
#: a bucket's name (a verdict's ``context_bucket``)
Bucket = Literal["<1k", "1-2k", "2-4k", "4-8k", ">=8k"]
BUCKETS: tuple[str, ...] = get_args(Bucket)
#: the separator of a bucketed decision key, ``"long@2-4k"``
SEPARATOR = "@"


def bucket_of(prompt_tokens: int) -> str:
    """The bucket of a prompt of ``prompt_tokens`` tokens: the first edge it is under."""
    for edge, label in zip(BUCKET_EDGES, BUCKETS):
        if prompt_tokens < edge:
            return label
    return BUCKETS[-1]


def bucket_key(category: str, bucket: str) -> str:
    """The decision key of one category's bucket: ``"long@2-4k"``."""
    return f"{category}{SEPARATOR}{bucket}"


def split_key(key: str) -> tuple[str, str | None]:
    """(category, bucket or None) of a decision key made by :func:`bucket_key` (or a plain category)."""
    category, sep, bucket = key.partition(SEPARATOR)
    return (category, bucket) if sep and bucket in BUCKETS else (key, None)


def bucket_range(bucket: str) -> tuple[int, int | None]:
    """[low, high) in tokens of a bucket (high None for the last)."""
    i = BUCKETS.index(bucket)
    low = 0 if i == 0 else BUCKET_EDGES[i - 1]
    return low, BUCKET_EDGES[i] if i < len(BUCKET_EDGES) else None


def decision_order(key: str) -> tuple[str, int]:
    """A sort key that keeps a category's buckets together, shortest first (``long@<1k`` before ``long@1-2k``)."""
    category, bucket = split_key(key)
    return category, -1 if bucket is None else BUCKETS.index(bucket)
