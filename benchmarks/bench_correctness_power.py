"""Power of the sampled-correctness gate against three wrong acceptance rules (a benchmark, not a test).

For each rule (the correct one, accept-always, p/q swapped, residual not renormalised) it draws
``--trials`` independent checks at the default sample size (specledger.gates.sampled_stats.DEFAULT_SAMPLES
samples per side of one prompt, DEFAULT_TOKENS tokens, gamma DEFAULT_GAMMA) on the tiny test models
(target: random Llama, vocab 16; drafter: a second random model, or the n-gram drafter), and prints
how often the gate fails each, with a 95 % Clopper-Pearson interval.

    python benchmarks/bench_correctness_power.py --trials 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

torch.set_num_threads(1)

from conftest import tiny_model  # noqa: E402
from mutant_verifiers import MUTANTS, mutant  # noqa: E402
from scipy.stats import beta  # noqa: E402

import specledger.engine.request as rq  # noqa: E402
from specledger.bench.sampled_pairs import sample_pairs  # noqa: E402
from specledger.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from specledger.engine.drafters.ngram import NgramDrafter  # noqa: E402
from specledger.gates import sampled_stats as c  # noqa: E402

PROMPT = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]
TEMPERATURE = 0.7


def models():
    return tiny_model(2, vocab=16, n_layers=1, dim=16), tiny_model(5, vocab=16, n_layers=1, dim=16)


def check(target, factory, seed: int, n: int = c.DEFAULT_SAMPLES) -> dict:
    spec, base = sample_pairs(target, PROMPT, factory, c.DEFAULT_GAMMA, TEMPERATURE, n=n, seed=seed,
                                max_batch=n)
    return c.sampled_test(spec, base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--drafter", choices=["model", "ngram"], default="model")
    ap.add_argument("--rules", default="", help="comma-separated subset of: correct," + ",".join(MUTANTS))
    args = ap.parse_args()
    target, draft = models()
    factory = (lambda: DraftModelDrafter(draft)) if args.drafter == "model" else NgramDrafter
    original = rq.verify_sampling
    print(f"drafter {args.drafter}, {c.DEFAULT_SAMPLES} samples per side, {c.DEFAULT_TOKENS} tokens, "
          f"gamma {c.DEFAULT_GAMMA}, T={TEMPERATURE}, alpha 0.01, {args.trials} trials")
    try:
        chosen = [r for r in args.rules.split(",") if r] or ["correct", *MUTANTS]
        for mode in [m for m in ("correct",) + MUTANTS if m in chosen]:
            rq.verify_sampling = original if mode == "correct" else mutant(mode)
            t0 = time.perf_counter()
            fails = sum(check(target, factory, seed=10_000 * (i + 1))["status"] == "fail" for i in range(args.trials))
            k, n = fails, args.trials
            lo = beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
            hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
            print(f"{mode:>17}: gate failed {k}/{n} = {100 * k / n:.0f} % (95% CI {100 * lo:.0f}-{100 * hi:.0f} %), "
                  f"{(time.perf_counter() - t0) / n:.1f} s per check", flush=True)
    finally:
        rq.verify_sampling = original


if __name__ == "__main__":
    main()
