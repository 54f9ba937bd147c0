"""ROUGE-L F1 over lowercased word tokens (no stemming, no stopword removal).

Tokens are maximal runs of Unicode letters and digits in the lowercased text (punctuation
and underscores separate words). With ``L = LCS(candidate, reference)`` (longest common
subsequence of the token lists), ``P = L / |candidate|``, ``R = L / |reference|`` and
``F1 = 2PR / (P + R)``.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[^\W_]+")


def word_tokens(text: str) -> list[str]:
    """Lowercased runs of letters/digits: ``"Don't stop!" -> ["don", "t", "stop"]``."""
    return _WORD.findall(text.lower())


def lcs_length(first: list[str], second: list[str]) -> int:
    """Length of the longest common subsequence; O(|first| * |second|) time, O(|second|) memory."""
    if len(second) > len(first):
        first, second = second, first
    previous = [0] * (len(second) + 1)
    for token in first:
        current = [0]
        for column, other in enumerate(second, start=1):
            if token == other:
                current.append(previous[column - 1] + 1)
            else:
                current.append(max(previous[column], current[column - 1]))
        previous = current
    return previous[-1]


def rouge_l_f1(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of ``candidate`` against ``reference`` in [0, 1].

    Two texts without any word tokens score 1.0 (identical); exactly one without tokens scores 0.0.
    """
    candidate_tokens, reference_tokens = word_tokens(candidate), word_tokens(reference)
    if not candidate_tokens or not reference_tokens:
        return 1.0 if candidate_tokens == reference_tokens else 0.0
    common = lcs_length(candidate_tokens, reference_tokens)
    if common == 0:
        return 0.0
    precision, recall = common / len(candidate_tokens), common / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)
