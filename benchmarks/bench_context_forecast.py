"""S at a context bucket a run did not measure, forecast from its other buckets and its cost surface, against
the measured S (issue 48's check; :mod:`specledger.predict.context_forecast`).

    .venv/bin/python benchmarks/bench_context_forecast.py RUN_DIR

RUN_DIR: a ``specledger run`` whose workload has categories decided per context bucket, e.g.
``specledger run --workload benchmarks/data/heldout_long48.jsonl --loads 1 --out RUN_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specledger.predict.context_forecast import leave_one_bucket_out  # noqa: E402
from specledger.rundir import read_records  # noqa: E402


def main() -> None:
    run = Path(sys.argv[1])
    meta = json.loads((run / "run.json").read_text())
    out = leave_one_bucket_out(read_records(run / "traces.jsonl"), meta)
    print(out["method"])
    print(f"{'bucket':<16} {'setting':<12} {'prompts':>7} {'context':>7} {'measured S':>10} {'forecast S':>10} "
          f"{'|error|':>7}")
    for r in out["rows"]:
        print(f"{r['category']:<16} {r['drafter'] + ' γ=' + str(r['gamma']):<12} {r['prompts']:>7} "
              f"{r['context']:>7.0f} {r['measured_speedup']:>10.3f} {r['predicted_speedup']:>10.3f} "
              f"{100 * r['abs_error']:>6.1f}%")
    if out["n"]:
        print(f"median |error| {100 * out['median_abs_error']:.1f} %, P90 {100 * out['p90_abs_error']:.1f} %, "
              f"max {100 * out['max_abs_error']:.1f} % over {out['n']} bucket settings")


if __name__ == "__main__":
    main()
