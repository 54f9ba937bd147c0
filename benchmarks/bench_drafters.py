"""Per-round cost of the model-free drafters on an 8k-token context with repeats.

Not a test: prints microseconds per ``propose`` + ``commit`` (one decode round) and the
one-off ``begin`` cost of indexing the prompt. The token stream is random over a 32k
vocabulary with spans copied from earlier in the stream (so lookups hit about half the
time); each round accepts the longest prefix of the proposal that matches the stream, as a
greedy verifier would, then commits one extra "target" token.

Run from the repository root: ``PYTHONPATH=. python benchmarks/bench_drafters.py [--tokens 8192] [--gamma 5]``
(``PYTHONPATH`` is only needed while the package is not installed in the venv).
"""

from __future__ import annotations

import argparse
import random
import time

from specledger.engine.drafters.base import Drafter
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.engine.drafters.suffix import SuffixDrafter
from specledger.engine.sampling import SamplingParams


def stream_with_repeats(length: int, vocab: int, seed: int) -> list[int]:
    """Random tokens; with probability 1/2 per segment, a copy of an earlier 8..64-token span."""
    rng = random.Random(seed)
    tokens = [rng.randrange(vocab) for _ in range(64)]
    while len(tokens) < length:
        span = rng.randrange(8, 65)
        if rng.random() < 0.5:
            start = rng.randrange(0, len(tokens) - span)
            tokens.extend(tokens[start : start + span])
        else:
            tokens.extend(rng.randrange(vocab) for _ in range(span))
    return tokens[:length]


def run(drafter: Drafter, stream: list[int], prompt_len: int, gamma: int) -> dict[str, float]:
    """Decode ``stream[prompt_len:]`` with ``drafter`` as the proposer; time each phase."""
    params = SamplingParams()
    t0 = time.perf_counter()
    drafter.begin(stream[:prompt_len], params)
    begin_s = time.perf_counter() - t0
    context = list(stream[:prompt_len])
    rounds = proposed = accepted = 0
    round_s = 0.0
    while len(context) < len(stream):
        t0 = time.perf_counter()
        tokens = drafter.propose(context, gamma, params, None).tokens
        t1 = time.perf_counter()
        truth = stream[len(context) : len(context) + len(tokens) + 1]
        n_ok = 0
        while n_ok < len(tokens) and n_ok < len(truth) and tokens[n_ok] == truth[n_ok]:
            n_ok += 1
        context.extend(truth[: n_ok + 1])
        t2 = time.perf_counter()
        drafter.commit(context)
        round_s += (t1 - t0) + (time.perf_counter() - t2)
        rounds += 1
        proposed += len(tokens)
        accepted += n_ok
    return {
        "begin_ms": begin_s * 1e3,
        "us_per_round": round_s / rounds * 1e6,
        "rounds": rounds,
        "accept_rate": accepted / max(proposed, 1),
        "tokens_per_round": (len(stream) - prompt_len) / rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="total context length at the end")
    parser.add_argument("--prompt", type=int, default=6144, help="prompt length (indexed in begin)")
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stream = stream_with_repeats(args.tokens, vocab=32_000, seed=args.seed)
    drafters: list[Drafter] = [NgramDrafter(), SuffixDrafter()]
    # a second suffix request that benefits from the global trie built by the first one
    warm = SuffixDrafter()
    warm.begin(stream[: args.prompt], SamplingParams())
    warm.commit(stream)
    warm.end(stream[: args.prompt], stream[args.prompt :])
    drafters.append(warm)
    labels = ["ngram", "suffix (cold global)", "suffix (warm global)"]
    print(f"context {args.prompt} -> {args.tokens} tokens, gamma={args.gamma}")
    for label, drafter in zip(labels, drafters):
        r = run(drafter, stream, args.prompt, args.gamma)
        print(
            f"{label:22s} propose+commit {r['us_per_round']:8.1f} us/round   begin {r['begin_ms']:7.1f} ms   "
            f"rounds {r['rounds']:5d}   accept {r['accept_rate']:.2f}   tokens/round {r['tokens_per_round']:.2f}"
        )


if __name__ == "__main__":
    main()
