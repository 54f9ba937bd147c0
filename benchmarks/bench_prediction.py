"""Does the forecast hold on prompts it never saw, at γ's it never saw? (issue 18's benchmark)

One `specledger run`-style sweep over a held-out workload (default ``benchmarks/data/heldout_forecast7.jsonl``:
18 chat prompts written for this check alone (2026-12-02, second session), before anything was run on them --
``edit`` (copy-heavy: restyle or convert given code, config or data and return all of it), ``parse``
(copy-heavy: pull named fields out of a short text into a fixed format), ``ask`` (open-ended questions)
-- that no part of the model was tuned or selected on. Earlier sets are kept for reference only, each was
looked at once a check had run on it: ``heldout_forecast.jsonl`` (the streak acceptance model),
``heldout_forecast2.jsonl`` (the measured baseline), ``heldout_forecast3.jsonl`` (the per-rows levels and the
median surface), ``heldout_forecast4.jsonl`` (the two-state chains), ``heldout_forecast5.jsonl``,
``heldout_forecast6.jsonl`` (run once with the window levels; its γ 8 rounds, priced 13 % low, led to the
line through the measured levels and the 9-pass surface)),
plain decoding and every drafter at every γ
of the checks, side by side per prompt (one round of each in turn) so the machine's drift hits every
setting alike. The run
measures its verify cost surface (rows 1-33) at start, as every `specledger run` does. Then, honestly,
for each check "fit γ's -> test γ" (default: 2,4 -> 8 and 4,8 -> 1):

  the cost model and the acceptance inputs are fitted on the plain and fit-γ records only (the test γ's
  records are removed before fitting, and the code asserts it), the test γ's end-to-end speed-up is
  predicted per (category, drafter) on the same prompts with a 5-95 % interval, and compared with the
  measured one. Reported: |error| per row, median / max, interval coverage, and E[L] and round time
  predicted vs measured (the two halves of the forecast).

Also the in-run leave-one-γ-out check over every γ run (what every `specledger run` reports), the
machine's noise (plain step P10 / P50 / P90), the measured H200 surfaces' hold-outs (error per held-back
point, ``bench_surface.py``) and the simulator's validation as ``bench_simulator.py`` last wrote it.
Speed-ups are end to end: (Σ tokens / Σ time incl. prefill)_spec / (same)_plain, on the same prompts;
the forecast prices both sides on the one cost model (:mod:`specledger.predict.predict`). Targets (issue 18):
median |error| <= 5 %, max <= 10 %.

Run from the repository root (about 12 minutes on 2 quiet cores with the defaults):

    .venv/bin/python benchmarks/bench_prediction.py [--workload FILE.jsonl | --categories code-edit,dialogue --n 4]
        [--drafters ngram] [--checks 2,4:8 4,8:1] [--max-tokens 96] [--out DIR] [--reuse]

It takes /tmp/specledger-bench.lock while it measures (``--no-lock`` to skip) and prints the exact
command line it ran with; results go to ``DIR/prediction_bench.json`` next to the run's traces.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x.strip()]


@contextlib.contextmanager
def bench_lock(enabled: bool):
    if not enabled:
        yield
        return
    with open("/tmp/specledger-bench.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'category':<12} {'drafter':<10} {'γ':>3} {'fit γ':>8} {'prompts':>7} {'measured S':>11} "
          f"{'predicted S':>12} {'5-95 %':>15} {'|error|':>8}")
    for r in rows:
        iv = r.get("interval") or [None, None]
        # the in-run check predicts without a bootstrap (n_boot=0): its "interval" is the point twice
        point_only = iv[0] is None or iv[0] == iv[1]
        ivs = "point only" if point_only else f"{iv[0]:.3f}-{iv[1]:.3f}"
        print(f"{r['category']:<12} {r['drafter']:<10} {r['gamma']:>3} {','.join(map(str, r['fitted_gammas'])):>8} "
              f"{r['prompts']:>7} {r['measured_speedup']:>11.3f} {r['predicted_speedup']:>12.3f} {ivs:>15} "
              f"{100 * r['abs_error']:>7.1f}%")
    rounds = [(r["predicted_rounds_per_request"], r["measured_rounds_per_request"]) for r in rows
              if r.get("measured_rounds_per_request")]
    if rounds:
        rerr = [abs(p - m) / m for p, m in rounds]
        print(f"rounds per request (timing-free: acceptance, fill, length): median |error| "
              f"{100 * statistics.median(rerr):.1f} %   P90 {100 * float(np.percentile(rerr, 90)):.1f} %")
    errs = [r["abs_error"] for r in rows]
    if errs:
        print(f"median |error| {100 * statistics.median(errs):.1f} %   P90 {100 * float(np.percentile(errs, 90)):.1f} %"
              f"   ({len(errs)} settings, {len({r['category'] for r in rows})} categories)")


def _check(fit: list[int], test: int) -> str:
    return f"{','.join(map(str, fit))}:{test}"


def _parse_check(text: str) -> tuple[list[int], int]:
    fit, test = text.split(":")
    return _csv(fit, int), int(test)


def _halves(rows: list[dict]) -> None:
    """E[L] and round time, predicted vs measured: which half of the forecast erred."""
    for r in rows:
        if r.get("measured_el") and r.get("predicted_el"):
            print(f"  {r['category']:<10} {r['drafter']:<7} γ={r['gamma']}: E[L] {r['predicted_el']:.2f} predicted vs "
                  f"{r['measured_el']:.2f} measured ({r.get('acceptance_source')}); round "
                  f"{r['predicted_t_round_ms']:.1f} vs {r['measured_t_round_ms']:.1f} ms")


def surface_checks(paths: list[Path] | None) -> dict:
    """The measured-surface hold-outs of ``bench_surface.py`` (default: the H200 files): error per held-back point."""
    from bench_surface import DEFAULT, check

    files = DEFAULT if paths is None else paths
    out = {}
    for path in files:
        if not path.exists():
            print(f"\n(no surface at {path}: skipped)")
            continue
        print(f"\nthe cost surface on points it was not given: {path}")
        out[path.name] = check(path)
    return out


def simulator_validation(path: Path | None) -> dict | None:
    """The simulator's validation as ``bench_simulator.py`` last wrote it (decidable points scored only)."""
    if path is None:
        found = sorted(Path("runs").glob("bench-simulator-*/bench_simulator.json"), key=lambda p: p.stat().st_mtime)
        path = found[-1] if found else None
    if path is None or not path.exists():
        print("\nsimulator validation: no bench_simulator.json yet (run benchmarks/bench_simulator.py)")
        return None
    import json

    from bench_simulator import print_validation

    res = json.loads(path.read_text(encoding="utf-8"))
    print(f"\nsimulator vs real serving, from {path} (its run: {res['run']}):\n")
    print_validation(res["validation"])
    return {"from": str(path), "run": res["run"]}


def reproducibility_of(run_dirs: list[Path]) -> dict | None:
    """The in-run check's measured side across runs of the same prompts (``predict.check.reproducibility``),
    printed beside the check: a forecast cannot score below its measurement's own noise."""
    if len(run_dirs) < 2:
        return None
    from specledger.predict.check import reproducibility
    from specledger.rundir import read_json

    checks = [read_json(Path(d) / "summary.json").get("prediction_check") or {} for d in run_dirs]
    res = reproducibility(checks)
    if res is None:
        print("reproducibility: no setting was measured in two of the runs")
        return None
    print(f"reproducibility of the measured S ({res['runs']} runs of the same prompts, {res['pairs']} setting pairs; "
          f"{', '.join(str(d) for d in run_dirs)}): run to run median {100 * res['median_run_to_run']:.1f} %, "
          f"P90 {100 * res['p90_run_to_run']:.1f} %; one run's own noise ≈ that / √2: median "
          f"{100 * res['median_single_run']:.1f} %, P90 {100 * res['p90_single_run']:.1f} % -- the floor under the "
          "in-run check's error")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", type=Path, default=Path("benchmarks/data/heldout_forecast7.jsonl"),
                    help="held-out JSONL workload ('' to use --categories)")
    ap.add_argument("--categories", default="code-edit,dialogue,math")
    ap.add_argument("--n", type=int, default=4, help="prompts per category (built-in categories only)")
    ap.add_argument("--drafters", default="ngram")
    ap.add_argument("--checks", nargs="+", default=["2,4:8", "4,8:1"], help="FIT_GAMMAS:TEST_GAMMA ...")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: runs/bench-prediction-<time>)")
    ap.add_argument("--reuse", action="store_true", help="analyse an existing --out without measuring again")
    ap.add_argument("--no-lock", action="store_true", help="do not take /tmp/specledger-bench.lock")
    ap.add_argument("--acceptance", choices=("replay", "chains"), default="replay",
                    help="replay: greedy model-free rounds replayed exactly where possible (the default forecast); "
                         "chains: the acceptance model alone (what sampled and model drafters get), to test it")
    ap.add_argument("--surfaces", nargs="*", type=Path, default=None,
                    help="import-format surfaces to hold points out of (default: the H200 files in ../shared/gpu; "
                         "none given: skip)")
    ap.add_argument("--simulator", type=Path, default=None,
                    help="a bench_simulator.json to print the simulator's validation from (default: the newest "
                         "runs/bench-simulator-*/bench_simulator.json)")
    ap.add_argument("--reproducibility", nargs="*", type=Path, default=[],
                    help="two or more `specledger run` directories of the same prompts (e.g. two `make run`s): "
                         "print how far their measured speed-ups differ, the noise floor under the in-run check")
    args = ap.parse_args(argv)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))

    from specledger.mainjob.job import RunPlan, run
    from specledger.predict.check import (
        leave_one_gamma_out,
        machine_noise,
        predict_held_out,
        summarize_errors,
        usable,
    )
    from specledger.rundir import META_NAME, TRACE_NAME, read_json, read_records, write_json_atomic

    checks = [_parse_check(c) for c in args.checks]
    if any(test in fit for fit, test in checks):
        ap.error("a check's test γ must not be one of its fit γ's")
    gammas = sorted({g for fit, test in checks for g in [*fit, test]})
    out = args.out or Path("runs") / time.strftime("bench-prediction-%Y%m%d-%H%M%S")
    t_start = time.perf_counter()
    if not args.reuse:
        from specledger.engine.build import build_engine

        workload = str(args.workload) if str(args.workload) else None
        plan = RunPlan(categories=_csv(args.categories), n_per_category=args.n, drafters=_csv(args.drafters),
                       gammas=gammas, model_gammas=gammas, max_tokens=args.max_tokens, workload_file=workload)
        engine = build_engine(None)
        with bench_lock(not args.no_lock):
            def progress(done: int, total: int, label: str) -> None:
                print(f"\r  [{done}/{total}] {label:<48}", end="", flush=True)

            run(out, plan, engine, progress=progress)
            print()
    meta = read_json(out / META_NAME)
    if args.acceptance == "chains":
        meta = {**meta, "prompts": {}}  # no token ids: no replayer, every forecast from the acceptance model
    records = usable(read_records(out / TRACE_NAME))
    max_tokens = (meta.get("config") or {}).get("max_tokens", args.max_tokens)
    results: dict[str, dict] = {}
    for fit, test in checks:
        train = [r for r in records if r.drafter == "none" or r.gamma in fit]  # the test γ leaves before fitting
        held: list[dict] = []
        for drafter in sorted({r.drafter for r in records if r.drafter != "none"}):
            held += predict_held_out(train, records, drafter, test, max_tokens, n_boot=200, meta=meta)
        _table(f"held out: fitted on plain + γ {fit}, predicted γ {test}, then compared with γ {test} as run", held)
        _halves(held)
        results[_check(fit, test)] = {"rows": held, **summarize_errors(held)}
    every = [r for res in results.values() for r in res["rows"]]
    total = summarize_errors(every)
    if every:
        print(f"\nall held-out checks: median |error| {100 * total['median_abs_error']:.1f} %, max "
              f"{100 * total['max_abs_error']:.1f} %, 5-95 % interval covered the measured S in "
              f"{100 * (total['interval_coverage'] or 0):.0f} % of {total['n']} rows")
    logo = leave_one_gamma_out(records, max_tokens, meta)
    _table("in run: leave one γ out", logo["rows"])
    noise = machine_noise(records)
    if noise:
        print(f"machine noise: plain step {noise['p10_ms']:.1f} / {noise['p50_ms']:.1f} / {noise['p90_ms']:.1f} ms "
              f"(P10 / P50 / P90 over {noise['requests']} plain requests)"
              + ("  -- BUSY MACHINE: P90/P10 > 1.5, the measured speed-ups are not reliable" if noise["busy"] else ""))
    repro = reproducibility_of(args.reproducibility)
    surfaces = surface_checks(args.surfaces)
    simulator = simulator_validation(args.simulator)
    result = {
        "surfaces": surfaces,
        "simulator": simulator,
        "reproducibility": repro,
        "command": [sys.executable, *sys.argv],
        "run_dir": str(out),
        "held_out": results,
        "held_out_all": total,
        "leave_one_gamma_out": logo,
        "machine_noise": noise,
        "seconds": time.perf_counter() - t_start,
    }
    write_json_atomic(out / "prediction_bench.json", result)
    print(f"results: {out / 'prediction_bench.json'}  ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
