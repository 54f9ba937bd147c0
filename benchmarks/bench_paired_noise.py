"""How noisy is a paired speed-up ratio on this machine? The measurement behind the decision's default
practical-equivalence margin (``SLO.equivalence_margin``, docs/decisions.md).

A/A test: every prompt runs the same settings twice side by side, exactly as the main job runs a prompt's
settings (:class:`specledger.engine.interleave.SideBySide`): plain, plain', ngram γ=4, ngram γ=4'. The two
copies of a setting produce identical tokens, so any difference in their time is the machine's. Prints,
per pair, the per-prompt ratio's spread (sd of the ratio estimator's influence u, :mod:`specledger.analysis.paired`)
and the half-width of the 90 % interval that spread gives after n prompts: a margin below that half-width
cannot be resolved in a run of n prompts, however equal the settings are.

    .venv/bin/python benchmarks/bench_paired_noise.py --prompts 12

Prompts: ``benchmarks/data/heldout_noise.jsonl`` (written for this benchmark, never used to tune a rule).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--workload", default=str(HERE / "data" / "heldout_noise.jsonl"))
    args = ap.parse_args()

    from specledger.analysis.paired import ratio_interval, t_quantile
    from specledger.engine.build import build_engine
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.interleave import SideBySide
    from specledger.engine.sampling import SamplingParams
    from specledger.workloads import encode_item
    from specledger.workloads.jsonl import load_jsonl

    engine = build_engine(None)
    items = load_jsonl(args.workload)[0][: args.prompts]
    side = SideBySide()
    settings = [("none", 0), ("none", 0), ("ngram", 4), ("ngram", 4)]
    drafters = [make_drafter(d, engine) for d, _ in settings]
    seconds: list[list[float]] = [[] for _ in settings]
    tokens: list[list[float]] = [[] for _ in settings]
    warm = encode_item(engine.loaded, items[0])  # the first requests of a process pay one-time costs
    side.run([(engine, warm, dict(drafter=dr, gamma=g, params=SamplingParams(temperature=0.0), max_tokens=8,
                                  request_id=f"warm|{i}")) for i, (dr, (_, g)) in enumerate(zip(drafters, settings))])
    for n, it in enumerate(items):
        ids = encode_item(engine.loaded, it)
        reqs = [(engine, ids, dict(drafter=dr, gamma=g, params=SamplingParams(temperature=0.0),
                                   max_tokens=args.max_tokens, request_id=f"{it.id}|{i}"))
                for i, (dr, (_, g)) in enumerate(zip(drafters, settings))]
        recs = side.run(reqs)
        for i, r in enumerate(recs):
            seconds[i].append(r.total_time)
            tokens[i].append(float(r.output_tokens))
        print(f"prompt {n + 1}/{len(items)}: {', '.join(f'{r.total_time * 1e3:.0f} ms' for r in recs)}", flush=True)

    def spread(a: int, b: int) -> tuple[float, float]:
        """(ratio a/b, sd of the per-prompt influence u) for settings a and b."""
        iv = ratio_interval([(tokens[a], 1), (seconds[a], -1), (tokens[b], -1), (seconds[b], 1)])
        ma, mb = statistics.fmean(seconds[a]), statistics.fmean(seconds[b])
        u = [sb / mb - sa / ma for sa, sb in zip(seconds[a], seconds[b])]
        return iv.ratio, statistics.stdev(u)

    print("\npair                      ratio   sd(u)   90 % half-width after n prompts: n=3   n=8   n=16")
    for name, (a, b) in (("plain / plain'", (0, 1)), ("ngram γ=4 / ngram γ=4'", (2, 3)),
                         ("ngram γ=4 / plain (S)", (2, 0))):
        r, sd = spread(a, b)
        halves = [100 * (math.exp(t_quantile(0.95, k - 1) * sd / math.sqrt(k)) - 1) for k in (3, 8, 16)]
        print(f"{name:<25} {r:.4f}  {100 * sd:5.2f} %  " + "  ".join(f"{h:5.2f} %" for h in halves))


if __name__ == "__main__":
    main()
