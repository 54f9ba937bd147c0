"""Where one plain fp32 decode step of SmolLM2-135M spends its time, and how a forward's cost grows with rows.

Prints: ms per decode step (context ~200), the per-op breakdown (each linear kind summed over the
30 layers, attention, norms + RoPE + residuals, the rest = Python/dispatch), each linear's GB/s,
the machine's read bandwidth (engine/bandwidth.py), and ms per forward at 1, 4, 8, 16, 32 rows
(verify passes: ``model.forward`` over T new positions).

    python benchmarks/profile_decode.py [--steps 40] [--rows 1,4,8,16,32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from specledger.engine import kernels
from specledger.engine.bandwidth import decode_bytes_per_token, decode_line, measure_read_bandwidth
from specledger.engine.kernels import ops
from specledger.engine.loader import load_model


def step_ms(model, cache, pos: int, steps: int) -> float:
    tok = torch.tensor([[42]])
    times = []
    for i in range(steps):
        t = time.perf_counter()
        model(tok, pos + i, cache)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def rows_ms(model, cache, pos: int, rows: int, reps: int) -> float:
    toks = torch.full((1, rows), 42)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        model(toks, pos, cache)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def breakdown(model, cache, pos: int, steps: int) -> dict[str, float]:
    """Per-op wall time of decode steps, by timing wrappers around each linear and SDPA."""
    acc: dict[str, float] = defaultdict(float)
    originals = {}

    def wrap(obj, attr, label):
        fn = getattr(obj, attr)
        originals[(id(obj), attr)] = (obj, attr, fn)

        def timed(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            acc[label] += time.perf_counter() - t
            return out
        setattr(obj, attr, timed)

    for blk in model.layers:
        for name in ("wqkv", "wo", "w13", "w2"):
            wrap(getattr(blk, name), "forward", name)
            wrap(getattr(blk, name), "fused_add", name)
    wrap(model.lm_head, "forward", "lm_head")
    wrap(ops, "rms_norm", "rms_norm")
    wrap(ops, "rope_", "rope")
    wrap(ops, "attend", "attention")
    wrap(ops, "silu_mul", "silu*up")
    try:
        tok = torch.tensor([[42]])
        t0 = time.perf_counter()
        for i in range(steps):
            model(tok, pos + i, cache)
        total = time.perf_counter() - t0
    finally:
        for obj, attr, fn in originals.values():
            if obj is ops:
                setattr(obj, attr, fn)
            else:
                delattr(obj, attr)
    out = {k: v / steps * 1e3 for k, v in acc.items()}
    out["total"] = total / steps * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--context", type=int, default=200)
    args = ap.parse_args()
    lm = load_model(None, dtype="float32")
    model = lm.model
    print(f"kernel: {kernels.status()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    bw = measure_read_bandwidth()
    wb = decode_bytes_per_token(model, args.context)  # weights + the KV of the context, per step
    with torch.inference_mode():
        cache = model.new_cache(args.context + args.steps * 3 + 64)
        model(torch.full((1, args.context), 7), 0, cache)
        step_ms(model, cache, args.context, 5)
        ms = step_ms(model, cache, args.context, args.steps)
        parts = breakdown(model, cache, args.context, args.steps)
        ms2 = step_ms(model, cache, args.context, args.steps)
        print(f"read bandwidth (measure_read_bandwidth): {bw / 1e9:.1f} GB/s; weights + KV {wb / 1e6:.0f} MB/token")
        ms = min(ms, ms2)
        print(f"decode step: {ms:.2f} ms = {1e3 / ms:.1f} tok/s = {decode_line(model, args.context, 1e3 / ms, bw)}")
        nbytes = {"wqkv": 0, "wo": 0, "w13": 0, "w2": 0}
        for blk in model.layers:
            for k in nbytes:
                nbytes[k] += getattr(blk, k).weight.numel() * 4
        nbytes["lm_head"] = model.lm_head.weight.numel() * 4
        total = parts.pop("total")
        print(f"breakdown (instrumented step {total:.2f} ms):")
        named = 0.0
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
            gbs = f"  {nbytes[k] / v / 1e6:5.1f} GB/s" if k in nbytes else ""
            print(f"  {k:18s} {v:6.2f} ms  {v / total * 100:4.1f}%{gbs}")
            named += v
        print(f"  {'rest (python, glue)':18s} {total - named:6.2f} ms  {(total - named) / total * 100:4.1f}%")
        print("rows -> ms per forward (verify pass of T rows at context ~"
              f"{args.context}):")
        base = None
        for r in (int(x) for x in args.rows.split(",")):
            v = rows_ms(model, cache, args.context, r, max(5, args.steps // 4))
            base = base or v
            print(f"  {r:3d} rows  {v:7.2f} ms  x{v / base:.2f} of 1 row")


if __name__ == "__main__":
    main()
