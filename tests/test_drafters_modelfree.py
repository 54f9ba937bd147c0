"""Model-free drafters: prompt lookup (``ngram``) and SuffixDecoding (``suffix``)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.engine.drafters.base import Drafter
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.engine.drafters.suffix import SuffixDrafter, TrieNode
from specledger.engine.sampling import SamplingParams
from specledger.errors import SpecLedgerError

GREEDY = SamplingParams()

# --------------------------------------------------------------------------------------------
# brute-force references


def ngram_reference_index(tokens: list[int], lo: int, hi: int) -> dict[tuple[int, ...], int]:
    """key -> largest j in 1..L-1 with tokens[j-len(key):j] == key (n-grams that have a successor)."""
    index: dict[tuple[int, ...], int] = {}
    for j in range(1, len(tokens)):
        for n in range(lo, min(hi, j) + 1):
            index[tuple(tokens[j - n : j])] = j
    return index


def ngram_reference_proposal(tokens: list[int], gamma: int, lo: int, hi: int) -> list[int]:
    """Longest n first; the most recent earlier occurrence of the last n tokens; what followed it."""
    length = len(tokens)
    for n in range(min(hi, length), lo - 1, -1):
        tail = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                extended = list(tokens)  # copy token by token, reading what was just written
                for k in range(gamma):
                    extended.append(extended[start + n + k])
                return extended[length:]
    return []


def trie_table(root: TrieNode) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every node's spelled string -> (count, continued); also checks the ``best`` invariant."""
    table: dict[tuple[int, ...], tuple[int, int]] = {}
    stack: list[tuple[tuple[int, ...], TrieNode]] = [((), root)]
    while stack:
        path, node = stack.pop()
        children = node.children or {}
        if path:
            table[path] = (node.count, node.continued)
        assert node.continued == sum(c.count for c in children.values())
        if children:
            assert node.best is not None and node.best.count == max(c.count for c in children.values())
            assert children[node.best.token] is node.best
        else:
            assert node.best is None
        for token, child in children.items():
            assert child.token == token and child.count > 0
            stack.append((path + (token,), child))
    return table


def substring_table(sequences: list[list[int]], depth: int) -> dict[tuple[int, ...], tuple[int, int]]:
    """(count, continued) of every substring of length <= depth, counted over all sequences."""
    count: Counter[tuple[int, ...]] = Counter()
    continued: Counter[tuple[int, ...]] = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for n in range(1, min(depth, len(seq) - i) + 1):
                count[tuple(seq[i : i + n])] += 1
                if n < depth and i + n < len(seq):
                    continued[tuple(seq[i : i + n])] += 1
    return {key: (count[key], continued[key]) for key in count}


def occurs(haystacks: list[list[int]], needle: list[int]) -> bool:
    n = len(needle)
    return any(h[i : i + n] == needle for h in haystacks for i in range(len(h) - n + 1))


# context histories: grow by a few tokens per round, sometimes roll back (truncate) first
small_tokens = st.integers(min_value=0, max_value=3)
rounds_strategy = st.lists(
    st.tuples(st.integers(min_value=0, max_value=6), st.lists(small_tokens, min_size=1, max_size=5)),
    min_size=1,
    max_size=25,
)


def contexts_from(prompt: list[int], rounds: list[tuple[int, list[int]]], rollback_every: int):
    """Yield successive contexts; every ``rollback_every``-th round first drops ``cut`` tokens."""
    context = list(prompt)
    for k, (cut, grow) in enumerate(rounds):
        if rollback_every and k % rollback_every == rollback_every - 1 and cut:
            context = context[: max(0, len(context) - cut)]
        context = context + grow
        yield context


# --------------------------------------------------------------------------------------------
# ngram


def test_ngram_proposes_continuation_of_repeated_span() -> None:
    d = NgramDrafter(max_ngram=3)
    context = [7, 8, 10, 11, 12, 13, 14, 15, 99, 10, 11, 12]
    d.begin(context, GREEDY)
    assert d.propose(context, 3, GREEDY, None).tokens == [13, 14, 15]
    # the continuation runs into the matched tail and keeps repeating it (overlapping copy)
    assert d.propose(context, 10, GREEDY, None).tokens == [13, 14, 15, 99, 10, 11, 12, 13, 14, 15]


def test_ngram_prefers_longest_ngram_over_more_recent_shorter_match() -> None:
    d = NgramDrafter(max_ngram=3, min_ngram=1)
    # trigram (1, 2, 3) occurred early, followed by 40; unigram 3 occurred later, followed by 50
    context = [1, 2, 3, 40, 41, 9, 3, 50, 51, 1, 2, 3]
    d.begin(context, GREEDY)
    assert d.propose(context, 2, GREEDY, None).tokens == [40, 41]
    # with only unigrams, the most recent earlier 3 wins
    d1 = NgramDrafter(max_ngram=1)
    d1.begin(context, GREEDY)
    assert d1.propose(context, 2, GREEDY, None).tokens == [50, 51]


def test_ngram_prefers_most_recent_occurrence() -> None:
    d = NgramDrafter(max_ngram=2)
    context = [5, 6, 1, 5, 6, 2, 5, 6]
    d.begin(context, GREEDY)
    assert d.propose(context, 1, GREEDY, None).tokens == [2]


def test_ngram_no_match_proposes_nothing_and_gamma_zero_is_empty() -> None:
    d = NgramDrafter(max_ngram=3, min_ngram=2)
    context = [1, 2, 3, 4, 5, 1]  # the bigram (5, 1) never occurred before; unigrams disabled
    d.begin(context, GREEDY)
    assert d.propose(context, 4, GREEDY, None).tokens == []
    repeat = [1, 2, 3, 1, 2]
    d.commit(repeat)  # not an extension: rebuilt
    assert d.propose(repeat, 0, GREEDY, None).tokens == []
    assert d.propose(repeat, 4, GREEDY, None).tokens == [3, 1, 2, 3]
    assert d.propose(repeat, 4, GREEDY, None).q is None


@pytest.mark.parametrize("kwargs", [{"min_ngram": 0}, {"max_ngram": 1, "min_ngram": 2}, {"max_ngram": 2.5}])
def test_ngram_rejects_bad_sizes(kwargs: dict) -> None:
    with pytest.raises(SpecLedgerError):
        NgramDrafter(**kwargs)


def test_ngram_rejects_negative_gamma() -> None:
    with pytest.raises(SpecLedgerError):
        NgramDrafter().propose([1, 2], -1, GREEDY, None)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(small_tokens, max_size=12),
    rounds=rounds_strategy,
    rollback_every=st.integers(min_value=0, max_value=4),
    sizes=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    gamma=st.integers(min_value=0, max_value=6),
)
def test_ngram_incremental_index_matches_brute_force(prompt, rounds, rollback_every, sizes, gamma) -> None:
    lo, extra = sizes
    hi = lo + extra
    d = NgramDrafter(max_ngram=hi, min_ngram=lo)
    d.begin(prompt, GREEDY)
    assert d.index_snapshot() == ngram_reference_index(prompt, lo, hi)
    for context in contexts_from(prompt, rounds, rollback_every):
        proposal = d.propose(context, gamma, GREEDY, None)
        assert proposal.q is None
        assert len(proposal.tokens) <= gamma
        assert proposal.tokens == ngram_reference_proposal(context, gamma, lo, hi)
        d.commit(context)
        assert d.index_snapshot() == ngram_reference_index(context, lo, hi)


def test_ngram_rollback_rebuilds_index() -> None:
    d = NgramDrafter(max_ngram=2)
    d.begin([1, 2, 3, 1, 2, 3], GREEDY)
    assert d.propose([1, 2, 3, 1, 2, 3, 1, 2], 1, GREEDY, None).tokens == [3]
    # the same length, but an earlier token changed: the index must not keep (9, ...) stale keys
    changed = [9, 2, 4, 1, 2, 4, 1, 2]
    d.commit(changed)
    assert d.index_snapshot() == ngram_reference_index(changed, 1, 2)
    assert d.propose(changed, 1, GREEDY, None).tokens == [4]


# --------------------------------------------------------------------------------------------
# suffix


def test_suffix_proposes_continuation_of_repeated_pattern() -> None:
    d = SuffixDrafter()
    pattern = [11, 12, 13, 14, 15, 16, 17, 18]
    context = [1, 2] + pattern * 3 + pattern[:3]
    d.begin(context, GREEDY)
    proposal = d.propose(context, 4, GREEDY, None)
    assert proposal.tokens == [14, 15, 16, 17]
    assert proposal.q is None
    assert d.propose(context, 0, GREEDY, None).tokens == []


def test_suffix_spec_length_scales_with_match_length() -> None:
    d = SuffixDrafter(max_spec_factor=1.0, max_spec_offset=0.0)
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 50, 3, 4]  # the tail (3, 4) matches two tokens
    d.begin(context, GREEDY)
    assert d.propose(context, 8, GREEDY, None).tokens == [5, 6]
    d_offset = SuffixDrafter(max_spec_factor=1.0, max_spec_offset=2.0)
    d_offset.begin(context, GREEDY)
    assert d_offset.propose(context, 8, GREEDY, None).tokens == [5, 6, 7, 8]


def test_suffix_cross_request_proposes_rest_of_earlier_output() -> None:
    d = SuffixDrafter()
    output = list(range(100, 130))
    prompt = [1, 2, 3]
    d.begin(prompt, GREEDY)
    d.commit(prompt + output)
    d.end(prompt, output)
    new_context = [7, 8, 9] + output[:6]
    d.begin(new_context, GREEDY)
    assert d.propose(new_context, 5, GREEDY, None).tokens == output[6:11]
    # without end() there is nothing to learn from
    fresh = SuffixDrafter()
    fresh.begin(new_context, GREEDY)
    assert fresh.propose(new_context, 5, GREEDY, None).tokens == []


def test_suffix_global_prompts_only_when_enabled() -> None:
    prompt = list(range(200, 220))
    for include, expected in ((False, []), (True, prompt[8:12])):
        d = SuffixDrafter(global_include_prompts=include)
        d.begin(prompt, GREEDY)
        d.end(prompt, [1, 2, 3])
        context = [5] + prompt[:8]
        d.begin(context, GREEDY)
        assert d.propose(context, 4, GREEDY, None).tokens == expected


def test_suffix_adaptive_length_shrinks_on_ambiguous_continuations() -> None:
    prefix = [100, 101, 102, 103, 104, 105]
    context = [900] + prefix

    def proposal_after(outputs: list[list[int]], min_token_prob: float) -> list[int]:
        d = SuffixDrafter(min_token_prob=min_token_prob)
        for out in outputs:
            d.begin([0], GREEDY)
            d.end([0], out)
        d.begin(context, GREEDY)
        return d.propose(context, 6, GREEDY, None).tokens

    unambiguous = [prefix + [1, 3, 50, 51]]
    split = [prefix + [x, y, 50, 51] for x in (1, 2) for y in (3, 4)]  # 1/2 then 1/2 again
    assert proposal_after(unambiguous, 0.3) == [1, 3, 50, 51]
    ambiguous = proposal_after(split, 0.3)  # path probabilities 0.5, 0.25 -> stop after one
    assert len(ambiguous) == 1 and ambiguous[0] in (1, 2)
    assert len(proposal_after(split, 0.1)) == 4  # 0.5, 0.25, 0.25, 0.25 all >= 0.1
    # frequency decides the branch: the majority continuation wins
    majority = [prefix + [1, 3, 50]] * 3 + [prefix + [2, 4, 60]]
    assert proposal_after(majority, 0.1) == [1, 3, 50]


def test_suffix_per_request_frequency_ratio_ignores_own_tail() -> None:
    # (5, 6) occurred twice before, always followed by 7: probability 1, not diluted to 2/3
    context = [5, 6, 7, 0, 5, 6, 7, 1, 5, 6]
    d = SuffixDrafter(min_token_prob=0.9)
    d.begin(context, GREEDY)
    assert d.propose(context, 1, GREEDY, None).tokens == [7]


def test_suffix_global_window_evicts_oldest_request() -> None:
    d = SuffixDrafter(global_window=2, max_depth=6)
    outputs = [list(range(10 * k + 100, 10 * k + 110)) for k in range(3)]
    for out in outputs:
        d.begin([1], GREEDY)
        d.end([1], out)
    assert d.global_sequences() == outputs[1:]
    assert trie_table(d.global_trie) == substring_table(outputs[1:], 6)
    for k, expected_hit in ((0, False), (1, True), (2, True)):
        context = [3] + outputs[k][:4]
        d.begin(context, GREEDY)
        tokens = d.propose(context, 3, GREEDY, None).tokens
        assert tokens == (outputs[k][4:7] if expected_hit else [])


@pytest.mark.parametrize(
    "kwargs",
    [{"max_depth": 1}, {"min_token_prob": 1.5}, {"max_spec_factor": -1.0}, {"global_window": -1}],
)
def test_suffix_rejects_bad_settings(kwargs: dict) -> None:
    with pytest.raises(SpecLedgerError):
        SuffixDrafter(**kwargs)


@settings(max_examples=120, deadline=None)
@given(
    prompt=st.lists(small_tokens, max_size=12),
    rounds=rounds_strategy,
    rollback_every=st.integers(min_value=0, max_value=4),
    depth=st.integers(min_value=2, max_value=6),
    gamma=st.integers(min_value=0, max_value=6),
)
def test_suffix_request_trie_matches_brute_force_and_proposals_are_grounded(
    prompt, rounds, rollback_every, depth, gamma
) -> None:
    d = SuffixDrafter(max_depth=depth, min_token_prob=0.0)
    d.begin(prompt, GREEDY)
    for context in contexts_from(prompt, rounds, rollback_every):
        tokens = d.propose(context, gamma, GREEDY, None).tokens
        assert trie_table(d.request_trie) == substring_table([context], depth)
        assert len(tokens) <= gamma
        if tokens:
            # grounded: some suffix of length m (earning >= len(tokens) tokens) was followed by them
            assert any(
                math.floor(m * d.max_spec_factor) >= len(tokens) and occurs([context], context[-m:] + tokens)
                for m in range(1, min(depth, len(context)) + 1)
            )
        d.commit(context)


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.lists(st.lists(small_tokens, min_size=1, max_size=10), min_size=1, max_size=6),
    window=st.integers(min_value=1, max_value=3),
    context=st.lists(small_tokens, min_size=1, max_size=10),
    gamma=st.integers(min_value=1, max_value=5),
)
def test_suffix_global_trie_matches_window_and_proposals_are_grounded(
    outputs, window, context, gamma
) -> None:
    depth = 4
    d = SuffixDrafter(max_depth=depth, global_window=window, min_token_prob=0.0)
    for out in outputs:
        d.begin([9], GREEDY)
        d.end([9], out)
    kept = outputs[-window:]
    assert d.global_sequences() == kept
    assert trie_table(d.global_trie) == substring_table(kept, depth)
    d.begin(context, GREEDY)
    tokens = d.propose(context, gamma, GREEDY, None).tokens
    assert len(tokens) <= gamma
    if tokens:
        assert any(
            m >= len(tokens) and occurs(kept + [context], context[-m:] + tokens)
            for m in range(1, min(depth, len(context)) + 1)
        )


@pytest.mark.parametrize("drafter", [NgramDrafter(), SuffixDrafter()], ids=lambda d: d.name)
def test_drafters_are_deterministic_and_bounded(drafter: Drafter) -> None:
    context = [1, 2, 3, 4] * 10
    drafter.begin(context[:5], GREEDY)
    first = drafter.propose(context, 3, GREEDY, None)
    second = drafter.propose(context, 3, GREEDY, None)
    assert first.tokens == second.tokens == [1, 2, 3]
    assert first.q is None and drafter.uses_model is False
    for gamma in range(0, 6):
        assert len(drafter.propose(context, gamma, GREEDY, None).tokens) == gamma


# --------------------------------------------------------------------------------------------
# forks: drafters of concurrent requests (continuous batching)


def test_suffix_forks_share_the_global_trie_and_never_walk_stale_nodes() -> None:
    server = SuffixDrafter(max_depth=6, min_token_prob=0.0, max_spec_factor=4.0, global_window=1)
    a, b = server.fork(), server.fork()
    a.begin([1, 2, 3], GREEDY)
    assert a.propose([1, 2, 3, 4, 5], 3, GREEDY, None).tokens == []  # nothing learned yet
    b.begin([7, 8], GREEDY)
    b.end([7, 8], [4, 5, 6, 4, 5, 6])  # b finishes while a is still running
    assert server.global_sequences() == a.global_sequences() == [[4, 5, 6, 4, 5, 6]]
    assert a.propose([1, 2, 3, 4, 5], 3, GREEDY, None).tokens == [6, 4, 5]
    c = server.fork()
    c.begin([7], GREEDY)
    c.end([7], [4, 5, 9, 4, 5, 9])  # the window (1) evicts b's output: a's matched nodes are gone
    assert a.propose([1, 2, 3, 4, 5], 3, GREEDY, None).tokens == [9, 4, 5]
    a.end([1, 2, 3], [4, 5])
    assert server.global_sequences() == [[4, 5]]


def test_forks_keep_per_request_state_apart() -> None:
    for proto in (NgramDrafter(), SuffixDrafter(global_window=0)):
        a, b = proto.fork(), proto.fork()
        assert a is not b and type(a) is type(proto)
        a.begin([1, 2, 3, 1, 2], GREEDY)
        b.begin([5, 6, 7, 5, 6], GREEDY)
        assert a.propose([1, 2, 3, 1, 2], 2, GREEDY, None).tokens == [3, 1]
        assert b.propose([5, 6, 7, 5, 6], 2, GREEDY, None).tokens == [7, 5]
