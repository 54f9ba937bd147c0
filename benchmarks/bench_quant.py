"""The quantized kernels at the hardware's limit: GB/s per decode shape and per forward, against measured read.

    .venv/bin/python benchmarks/bench_quant.py [--threads 2] [--repeats 30]

1. Each SmolLM2-135M linear shape (q|k|v, o, gate|up, down, LM head) in Q4_1 and Q8_0 at 1, 2, 4 and 8 rows:
   best-of-``repeats`` ms per call and weight bytes / time (the kernel streams the packed blocks once per call).
2. The bundled GGUF with its own blocks (``--dtype gguf``) against float32: one decode step and one verify pass of
   k rows (``--rows``, default 1,2,3,5,9) over a ``--context``-token context (default 256), ms (median of
   ``repeats``) -- the verify premium t(k rows) / t(1 row) at 96 MB vs 538 MB of weights per pass -- and bytes per
   token x steps/s against the read bandwidth measured in the same run (``engine/bandwidth.py``). Issue 45's bars:
   3 rows <= 1.25x and 5 rows <= 1.5x one row at context 256 on the GGUF.
The machine is shared (2 cores): figures move with the other jobs; compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specledger.engine import bandwidth, kernels  # noqa: E402
from specledger.engine.loader import load_model  # noqa: E402
from specledger.engine.quant_gguf import QuantLinear, quantize_blocks  # noqa: E402

SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate|up", 3072, 576), ("down", 576, 1536), ("head", 49152, 576)]


def _times(fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn``, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _best(fn, repeats: int) -> float:
    return min(_times(fn, repeats))


def _median(fn, repeats: int) -> float:
    return statistics.median(_times(fn, repeats))


def kernel_table(repeats: int) -> None:
    print(f"kernel path: {kernels.lib().specledger_qpath().decode()}")
    print(f"{'shape':>8} {'fmt':>5} {'MB':>6} " + " ".join(f"{f'{m} row ms':>9} {'GB/s':>5}" for m in (1, 2, 4, 8)))
    for name, n, k in SHAPES:
        w = torch.randn(n, k)
        for fmt in ("Q4_1", "Q8_0"):
            lin = QuantLinear(fmt, quantize_blocks(w, fmt), n, k)
            mb = lin.packed.numel() / 1e6
            cells = []
            for m in (1, 2, 4, 8):
                x = torch.randn(m, k)
                t = _best(lambda lin=lin, x=x: lin(x), repeats)
                cells.append(f"{t * 1e3:9.3f} {mb / 1e3 / t:5.1f}")
            print(f"{name:>8} {fmt:>5} {mb:6.2f} " + " ".join(cells))


def model_table(repeats: int, ctx: int = 256, rows: tuple[int, ...] = (1, 2, 3, 5, 9)) -> None:
    print(f"\nforward passes over a {ctx}-token context (median of {repeats}):")
    print(f"{'target':>18} {'MB/pass':>8} " + " ".join(f"{f'{m} rows ms':>10}" for m in rows) + "   premium "
          + " ".join(f"k={m}" for m in rows[1:]))
    step_tps = {}
    for dtype in ("gguf", "fp32"):
        lm = load_model(None, dtype=dtype)
        model = lm.model
        cache = model.new_cache(ctx + 16)
        with torch.inference_mode():
            model(torch.randint(0, 1000, (1, ctx)), 0, cache, last_only=True)
            cells = []
            for m in rows:
                toks = torch.randint(0, 1000, (1, m))
                cells.append(_median(lambda toks=toks, model=model, cache=cache: model(toks, ctx, cache), repeats))
        label = lm.weights or "float32"
        step_tps[label] = (model, 1.0 / cells[0])
        print(f"{label:>18} {model.weight_bytes() / 1e6:8.1f} " + " ".join(f"{c * 1e3:10.2f}" for c in cells)
              + "   " + " ".join(f"{c / cells[0]:.2f}x" for c in cells[1:]))
    bw = bandwidth.measure_read_bandwidth()
    print("\nbandwidth of one decode step (weights + KV of the context) at the steps/s above:")
    for label, (model, tps) in step_tps.items():
        print(f"  {label}: {bandwidth.decode_line(model, ctx, tps, bw)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--kernels-only", action="store_true")
    ap.add_argument("--models-only", action="store_true")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rows", default="1,2,3,5,9", help="verify-pass sizes; the first is the step they divide by")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kernels.lib() is None:
        raise SystemExit(f"native kernel unavailable: {kernels.status()}")
    print(f"{args.threads} threads; measured read bandwidth {bandwidth.measure_read_bandwidth() / 1e9:.1f} GB/s "
          "(shared machine)")
    if not args.models_only:
        kernel_table(args.repeats)
    if not args.kernels_only:
        model_table(args.repeats, args.context, tuple(int(r) for r in args.rows.split(",")))


if __name__ == "__main__":
    main()
