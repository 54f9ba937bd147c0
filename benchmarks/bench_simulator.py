"""The serving simulator against real serving runs on this machine, and its speed.

Default: runs a real serving sweep here (plain and ngram γ=1,2,4,8 at concurrency 1, 4, 16, twelve
repeats (``--repeats``; printed below: the count at which most points would be decidable at the spread this
machine showed), the same prompts for every setting, on held-out prompts written for this check
(``benchmarks/data/heldout_serving3.jsonl``: 4 ``fixbug`` code edits + 4 ``howto`` questions, written
2026-12-02 before anything ran on it; ``heldout_serving.jsonl`` and ``heldout_serving2.jsonl`` were earlier
checks'; ``--workload``); ~2.5 minutes a repeat on 2 quiet cores), then simulates every
point -- same prompts, same order, same load -- with acceptance from the run's per-prompt chains and
step costs fitted on the run's *other* repeats (leave-one-repeat-out), and prints per load and
setting real vs simulated throughput, TPOT P50, TTFT P50 and ITL P99 with the error and whether it is
within the issue's tolerance (5%, 10%, 10%, 15%) -- scored only where the point is decidable, i.e. where the
real mean's 95 % half-width is below that tolerance. The sweep serves a load's settings back to back in each
repeat, so a slow minute of the machine moves all of them alike: the half-width is the randomized-block one,
that common drift taken out (``simulate/validate.blocked_noise``); the half-width without blocking and the
range are printed beside it. Then the crossover per load for both.
``--from DIR`` takes an existing ``sweep --experiment serving`` run instead; ``--profile FILE`` prices
steps with a calibrated cost profile instead of the leave-one-out fit.

Speed: 1,000,000 requests through one simulated replica kept full (closed loop at concurrency 256: an
8B Llama-style model on an H200 roofline, labelled as assumed; the run's measured ngram chains; vLLM-like
settings), timed on this machine; then as many at a light Poisson load, where batches are small and a
step-by-step simulator pays most per request (~steps = requests x rounds / batch); then a tenth as many at
that load stepped one step at a time and event-skipped, side by side (same figures, the time ratio).

Run it alone (it times things):
    flock /tmp/specledger-bench.lock .venv/bin/python benchmarks/bench_simulator.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["sweep", "--experiment", "serving", "--categories", "code-edit,dialogue", "--n", "4",
         "--concurrencies", "1,4,16", "--serving-drafters", "ngram:1,ngram:2,ngram:4,ngram:8"]
LLAMA_8B = {"params": 8.03e9, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
            "name": "llama-3-8b (config figures)"}


def real_sweep(out: Path, repeats: int, workload: Path | None = None) -> Path:
    sweep = list(SWEEP)
    if workload is not None:  # held-out prompts: every category of the file
        cats = sorted({json.loads(line)["category"] for line in workload.read_text().splitlines() if line.strip()})
        sweep[sweep.index("--categories") + 1] = ",".join(cats)
        sweep += ["--workload", str(workload)]
    cmd = [str(ROOT / ".venv" / "bin" / "specledger"), *sweep, "--repeats", str(repeats), "--out", str(out)]
    print("real serving sweep:", " ".join(cmd), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"  done in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def fmt(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def print_validation(res: dict) -> None:
    from specledger.simulate.validate import METRICS, TOLERANCE

    names = {"throughput_tok_s": "tok/s", "tpot_p50_ms": "TPOT P50", "ttft_p50_ms": "TTFT P50",
             "itl_p99_ms": "ITL P99"}
    head = f"{'c':>3} {'setting':<11}" + "".join(f" | {names[m] + ' real/sim (err)':>31}" for m in METRICS)
    print(head)
    print("-" * len(head))
    inside = {m: 0 for m in METRICS}
    decidable = {m: 0 for m in METRICS}
    decidable_raw = {m: 0 for m in METRICS}
    for p in res["points"]:
        cells = []
        for m in METRICS:
            v = p[m]
            ok = is_decidable(v, TOLERANCE[m])
            decidable[m] += ok
            raw = v.get("real_ci_half_unblocked", v.get("real_ci_half"))
            decidable_raw[m] += raw is not None and raw < TOLERANCE[m]
            inside[m] += bool(v["within"]) and ok
            mark = ("ok" if v["within"] else "XX") if ok else "--"
            cells.append(f"{fmt(v['real']):>9} / {fmt(v['sim']):>9} ({100 * v['error']:+6.1f}% {mark})")
        print(f"{p['load']:>3} {p['setting']:<11}" + "".join(f" | {c:>31}" for c in cells))
    print("\nITL P99 / TPOT P50 (ms) real vs per-request chains vs mean-only "
          "(E[K] every round, inference-sim's model):")
    for p in res["points"]:
        if p.get("itl_p99_ms_mean_only") is not None:
            print(f"  c={p['load']:>3} {p['setting']:<11} ITL P99 {fmt(p['itl_p99_ms']['real'])} / "
                  f"{fmt(p['itl_p99_ms']['sim'])} / {fmt(p['itl_p99_ms_mean_only'])}   TPOT P50 "
                  f"{fmt(p['tpot_p50_ms']['real'])} / {fmt(p['tpot_p50_ms']['sim'])} / "
                  f"{fmt(p['tpot_p50_ms_mean_only'])}")
    print("\nnoise floor per point: the real mean's 95 % half-width, the machine's drift common to a repeat taken "
          "out (randomized blocks: a load's settings run back to back in each repeat) {without blocking} "
          "(range (max - min) / mean of the repeats) [repeats that would make it decidable]:")
    for p in res["points"]:
        cells = []
        for m in METRICS:
            v = p[m]
            half, spread = v.get("real_ci_half"), v.get("real_spread")
            raw = v.get("real_ci_half_unblocked", half)
            need = repeats_to_decide(v, TOLERANCE[m]) if not is_decidable(v, TOLERANCE[m]) else None
            cells.append(f"{names[m]} " + ("n/a" if half is None else
                                           f"±{100 * half:.1f}% {{±{100 * raw:.1f}%}} ({100 * spread:.1f}%)")
                         + (f" [{need}]" if need else ""))
        print(f"  c={p['load']:>3} {p['setting']:<11} " + "  ".join(cells))
    n = len(res["points"])
    reps = max((p.get("repeats", 0) for p in res["points"]), default=0)
    print(f"decidable points ({reps} repeats; the real mean's 95 % half-width below the tolerance; '--' above: "
          "such a point cannot be judged, the measurement itself is not that sure): "
          + ", ".join(f"{names[m]} {decidable[m]}/{n}" for m in METRICS)
          + " (without taking the repeat's drift out: "
          + ", ".join(f"{names[m]} {decidable_raw[m]}/{n}" for m in METRICS)
          + ")")
    print("repeats at which most points would be decidable (at each point's measured spread): " + ", ".join(
        f"{names[m]} {repeats_for_most(res['points'], m, TOLERANCE[m])}" for m in METRICS))
    print("within tolerance, of the decidable points: " + ", ".join(
        f"{names[m]} {inside[m]}/{decidable[m]} (±{100 * TOLERANCE[m]:.0f}%)" for m in METRICS))
    print("\ncrossover per load (smallest γ with speed-up < 1; best γ, 0 = plain):")
    for c in res["crossover"]:
        print(f"  c={c['load']:>3} {c['drafter']}: real crossover γ={c['crossover_real']} best {c['best_real']} | "
              f"sim crossover γ={c['crossover_sim']} best {c['best_sim']} | {'same' if c['same'] else 'DIFFERENT'}; "
              "real speed-up per γ (repeats) " + ", ".join(f"γ{g}: {s}" for g, s in c["real_sides"].items())
              + f" -> simulated {'consistent' if c['consistent'] else 'INCONSISTENT'} with what the repeats resolve")
    print("cost:", "; ".join(sorted(set(res["cost_source"].values()))))


def speed(run, n: int, concurrency: int | None, rate: float | None, fast: bool = True) -> dict:
    """Wall time to simulate ``n`` requests on one replica: closed loop at ``concurrency`` or Poisson ``rate``;
    ``fast=False``: one step at a time (the reference the event-skipping path is tested against)."""
    from specledger.cost.roofline import model_config_from_dict, roofline
    from specledger.simulate.arrivals import closed_loop, poisson
    from specledger.simulate.measured_run import acceptance_table
    from specledger.simulate.simulator import simulate
    from specledger.simulate.state import ServerConfig

    table, _ = acceptance_table(run.serving_records() or run.records, "ngram")
    cost = roofline("h200", model_config_from_dict(LLAMA_8B))
    cfg = ServerConfig(max_num_seqs=256, max_num_batched_tokens=8192, kv_budget_tokens=cost.kv_budget_tokens(),
                       block_size=16, chunked_prefill=True)
    arr = closed_loop(concurrency) if concurrency else poisson(rate or 1.0, n, seed=0)
    t = time.perf_counter()
    res = simulate(table, arr, n, cost, 4, "ngram", cfg, seed=0, fast=fast)
    wall = time.perf_counter() - t
    m = res.metrics()
    return {**m, "requests": n, "load": arr.label, "simulated_makespan_s": m["wall_s"], "wall_s": wall,
            "requests_per_s": n / wall, "steps_per_s": m["steps"] / wall, "cost": cost.source, "fast": fast,
            "fast_steps": int(res.ledger.fast_steps)}


def print_speed(s: dict) -> None:
    how = f"event skipping ({s['fast_steps']:,} of the steps taken on the fast path)" if s["fast"] else "step by step"
    print(f"  {how}: {s['requests']:,} requests at {s['load']} in {s['wall_s']:.1f} s "
          f"({s['requests_per_s']:,.0f} req/s; "
          f"{s['steps']:,} steps at {s['steps_per_s']:,.0f} steps/s, mean batch {s['mean_batch']:.1f}; simulated "
          f"{s['simulated_makespan_s']:,.0f} s of serving: {s['throughput_tok_s']:,.0f} tok/s, TPOT P50 "
          f"{s['tpot_p50_ms']:.1f} ms, ITL P99 {s['itl_p99_ms']:.1f} ms)")


def is_decidable(v: dict, tolerance: float) -> bool:
    """A point can be judged when the real figure it is compared with -- the mean of its repeats -- is known
    more closely than the tolerance: the 95 % t-interval of that mean, half-width over the mean, below it.
    The interval is the randomized-block one (``validate.blocked_noise``): a load's settings run back to back
    in each repeat, so the machine's drift from one repeat to the next moves them alike and is taken out.
    (The range (max - min) / mean is printed too, but it grows with more repeats, so it cannot say when
    enough were taken.) With one repeat nothing says how far the measurement itself moves: not decidable."""
    half = v.get("real_ci_half")
    return half is not None and half < tolerance


def repeats_to_decide(v: dict, tolerance: float, cap: int = 1000) -> int | None:
    """Repeats that would bring the mean's 95 % half-width below ``tolerance`` if the relative sd stays as
    measured: the least n >= the current count with ``validate.half_width(sd, n, settings)`` < tolerance
    (None with fewer than two repeats; ``cap`` + 1 when even ``cap`` would not do)."""
    from specledger.simulate.validate import half_width

    noise = v.get("noise")
    if not noise:
        return None
    for n in range(noise["repeats"], cap + 1):
        if half_width(noise["rel_sd"], n, noise["settings"]) < tolerance:
            return n
    return cap + 1


def repeats_for_most(points: list[dict], metric: str, tolerance: float) -> int | None:
    """Repeats at which most points (more than half) of ``metric`` would be decidable, at their measured spread."""
    need = sorted(repeats_to_decide(p[metric], tolerance) or 10**9 for p in points)
    k = len(need) // 2  # the (n//2 + 1)-th smallest: more than half are decidable at it
    return need[k] if need and need[k] < 10**9 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="from_", type=Path, help="an existing `sweep --experiment serving` run")
    ap.add_argument("--out", type=Path, help="where the real sweep goes (default runs/bench-simulator-<time>)")
    ap.add_argument("--profile", type=Path, help="a calibrated cost profile instead of the leave-one-out fit")
    ap.add_argument("--workload", type=Path, default=ROOT / "benchmarks" / "data" / "heldout_serving3.jsonl",
                    help="prompts for the real sweep (default: a held-out set written for this check, never tuned on)")
    ap.add_argument("--repeats", type=int, default=12, help="repeats of the real sweep (each point is simulated "
                    "with step costs fitted on the others)")
    ap.add_argument("--seeds", type=int, default=16, help="simulations per point (acceptance draws)")
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests for the speed test (0: skip)")
    ap.add_argument("--concurrency", type=int, default=256, help="speed test: closed-loop concurrency")
    ap.add_argument("--light-rate", type=float, default=20.0,
                    help="speed test at light load: Poisson rate (req/s) for a tenth of the requests")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from specledger.cost.loader import load_pricer as load_cost
    from specledger.simulate.measured_run import RunSource
    from specledger.simulate.validate import validate

    print("command: flock /tmp/specledger-bench.lock .venv/bin/python benchmarks/bench_simulator.py "
          + " ".join(sys.argv[1:]))
    run_dir = args.from_ or real_sweep(args.out or ROOT / "runs" / time.strftime("bench-simulator-%Y%m%d-%H%M%S"),
                                        args.repeats, args.workload)
    run = RunSource.open(run_dir)
    t = time.perf_counter()
    res = validate(run, cost=load_cost(args.profile) if args.profile else None, seeds=args.seeds)
    print(f"\nsimulator vs real serving ({run_dir}; simulated in {time.perf_counter() - t:.1f} s)\n")
    print_validation(res)
    out = {"run": str(run_dir), "validation": res}
    if args.requests:
        print("\nspeed (one replica: llama-3-8b on an H200 roofline, assumed efficiencies; max_num_seqs 256, chunked "
              "prefill 8192 tokens/step, KV blocks of 16, ngram γ=4 with this run's chains):")
        s = speed(run, args.requests, args.concurrency, None)
        print_speed(s)
        light = speed(run, args.requests, None, args.light_rate)
        print_speed(light)
        # side by side: a tenth of the requests at the light load, stepped one step at a time and event-skipped
        tenth = max(1, args.requests // 10)
        ref, fast = speed(run, tenth, None, args.light_rate, fast=False), speed(run, tenth, None, args.light_rate)
        print_speed(ref)
        print_speed(fast)
        keys = ("tokens", "simulated_makespan_s", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms", "steps", "preemptions")
        print(f"  event skipping is {ref['wall_s'] / fast['wall_s']:.1f}x faster than stepping at that load; "
              f"identical figures: {all(ref[k] == fast[k] for k in keys)}")
        out["speed"] = {"saturated": s, "light": light, "light_step_by_step": ref, "light_event_skipping": fast}
    (Path(run_dir) / "bench_simulator.json").write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    print(f"wrote {Path(run_dir) / 'bench_simulator.json'}")


if __name__ == "__main__":
    main()
