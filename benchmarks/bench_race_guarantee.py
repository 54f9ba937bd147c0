"""The race's error rate and its cost in prompts, before and after the confidence sequence (a benchmark, not a test).

Simulated races (tests/race_sim.py: the measured per-prompt spread, the real race loop and decision rule) of

- two settings of equal speed (S 1.10 each against plain): how often a race ends "winner" (one called faster
  than the other) or "off" (speculation called not worth it): both false;
- two settings 10 % apart (S 1.21 and 1.10): how often the race finds the faster one as the winner within the
  race's per-category cap (48 prompts), and at how many prompts;

each under the decisions' intervals now (the confidence sequence, :mod:`specledger.analysis.sequential`) and under
the rule before it (Student's t at 1 − α per look). Prints one row per (case, rule, spread).

    python benchmarks/bench_race_guarantee.py --races 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import race_sim as rs  # noqa: E402


def summarize(outcomes: list[rs.Outcome], faster: str | None) -> str:
    """"false winner x, false off y" for equal settings; "found x at n prompts (median, P90)" for a faster one."""
    k = len(outcomes)
    if faster is None:
        win = sum(o.resolution == "winner" for o in outcomes) / k
        off = sum(o.resolution == "off" for o in outcomes) / k
        settled = [o.prompts for o in outcomes if o.resolution != "open"]
        at = f" at {statistics.median(settled):.0f} prompts (median)" if settled else ""
        return (f"false calls {rs.false_calls(outcomes):.3f} (winner {win:.3f}, off {off:.3f}); resolved "
                f"{len(settled) / k:.2f}{at}")
    found = sorted(o.prompts for o in outcomes if o.resolution == "winner" and o.setting == faster)
    wrong = sum(o.resolution != "open" and o.setting != faster for o in outcomes) / k
    p90 = found[int(0.9 * (len(found) - 1))] if found else None
    by = ", ".join(f"{sum(n <= m for n in found) / k:.2f} by {m}" for m in (8, 16, 24))
    return (f"winner found {len(found) / k:.3f} within {rs.MAX_PROMPTS_PER_CATEGORY} prompts ({by})"
            + (f" at {statistics.median(found):.0f} prompts (median), {p90} (P90 of those found)" if found else "")
            + f"; another call {wrong:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--sd-s", type=float, nargs="+", default=[rs.SD_S, 0.10],
                    help="per-prompt SD of log S against plain (default: the documented 0.26 and a run's 0.10)")
    args = ap.parse_args()
    for sd_s in args.sd_s:
        for name, multiplier in (("confidence sequence", None), ("per-look t (before)", rs.per_look_t)):
            undo = rs.with_multiplier(multiplier) if multiplier else (lambda: None)
            try:
                for case, (s_a, s_b), faster in (("equal speed", (1.10, 1.10), None),
                                                 ("10 % apart", (1.21, 1.10), rs.A.name)):
                    t0 = time.perf_counter()
                    out = rs.races(s_a, s_b, args.races, args.seed, sd_s=sd_s)
                    print(f"sd_S {sd_s:.2f} sd_pair {rs.SD_PAIR:.2f} | {case:<11} | {name:<20} | "
                          f"{summarize(out, faster)} ({time.perf_counter() - t0:.0f} s)", flush=True)
            finally:
                undo()


if __name__ == "__main__":
    main()
