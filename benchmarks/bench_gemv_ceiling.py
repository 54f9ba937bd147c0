"""What fraction of the read probe an fp32 matrix-vector product can reach on this machine at all.

    flock /tmp/specledger-bench.lock .venv/bin/python benchmarks/bench_gemv_ceiling.py [--mb 538] [--repeats 9]

Plain decode of the bundled target is a chain of matrix-vector products over its weights (538 MB in fp32)
plus attention, norms and glue. So the share of the machine's read bandwidth that decode can reach is
bounded by what one matrix-vector product over the same bytes reaches with nothing else to do. Printed,
interleaved over ``--repeats`` rounds (medians, and the best, beside the read probe measured in the same
rounds):

* the read probe (``engine/bandwidth.measure_read_bandwidth``: ``torch.sum`` over 256 MiB, decode's threads);
* the native kernel (``engine/kernels``: packed weights, one sequential stream) over one [N, 576] fp32
  matrix of ``--mb`` MB, one row: the ceiling with no glue, no attention, no small calls;
* the native kernel over the target's own layer shapes in decode order (q/k/v, o, gate/up, down per layer,
  then the lm_head): the same bytes in the 151 calls one decode step makes;
* ``torch.nn.functional.linear`` (oneDNN / MKL) over the big matrix, and ``numpy.dot``;
* the same big matrix in bf16 through the native kernel (half the bytes: what ``--dtype bfloat16`` buys).

If the single big fp32 product stays below 70 % of the probe, no fp32 decode on this machine reaches 70 %:
the issue's target is then out of reach by the hardware, and the figures show it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _best_of(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=538.0, help="size of the single fp32 matrix, MB")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    from specledger.engine import kernels
    from specledger.engine.bandwidth import measure_read_bandwidth

    if kernels.lib() is None:
        raise SystemExit(f"native kernel unavailable: {kernels.status()}")
    k = 576
    n = int(args.mb * 1e6 / (k * 4)) // 8 * 8
    g = torch.Generator().manual_seed(0)
    big = torch.randn(n, k, generator=g) * 0.02
    big_lin = kernels.PackedLinear(big, None)
    big_bf16 = kernels.PackedLinear(big.to(torch.bfloat16), None)
    big_np = big.numpy()
    x = torch.randn(1, k, generator=g)
    x_np = x.numpy()[0]
    xb = x.to(torch.bfloat16)
    # the target's shapes (SmolLM2-135M): per layer qkv [960, 576], o [576, 576], gate/up [3072, 576],
    # down [576, 1536]; then the tied lm_head [49152, 576]
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    layers = [kernels.PackedLinear(torch.randn(a, b, generator=g) * 0.02, None) for a, b in shapes]
    inputs = {b: torch.randn(1, b, generator=g) for _, b in shapes}
    layer_bytes = sum(a * b * 4 for a, b in shapes)
    big_bytes = n * k * 4

    def step() -> None:
        for lin in layers:
            lin(inputs[lin.k])

    figs: dict[str, list[float]] = {name: [] for name in
                                    ("probe", "kernel 1 matrix", "kernel decode shapes", "torch F.linear", "numpy.dot",
                                     "kernel bf16 1 matrix")}
    with torch.inference_mode():
        for fn in (lambda: big_lin(x), step, lambda: torch.nn.functional.linear(x, big), lambda: big_bf16(xb)):
            fn()  # warm-up: pages touched, code paths loaded
        for _ in range(args.repeats):
            figs["probe"].append(measure_read_bandwidth(repeats=3))
            figs["kernel 1 matrix"].append(big_bytes / _best_of(lambda: big_lin(x)))
            figs["kernel decode shapes"].append(layer_bytes / _best_of(step))
            figs["torch F.linear"].append(big_bytes / _best_of(lambda: torch.nn.functional.linear(x, big)))
            figs["numpy.dot"].append(big_bytes / _best_of(lambda: big_np @ x_np))
            figs["kernel bf16 1 matrix"].append(big_bytes / 2 / _best_of(lambda: big_bf16(xb)))
    probe = statistics.median(figs["probe"])
    print(f"fp32 matrix [{n}, {k}] = {big_bytes / 1e6:.0f} MB; decode shapes {layer_bytes / 1e6:.0f} MB in "
          f"{len(shapes)} calls; threads {torch.get_num_threads()}; {args.repeats} interleaved rounds (median, best)")
    for name, vals in figs.items():
        med = statistics.median(vals)
        print(f"  {name:<22} {med / 1e9:6.1f} GB/s (best {max(vals) / 1e9:5.1f})  = {100 * med / probe:5.1f} % of the "
              f"probe's median {probe / 1e9:.1f} GB/s")
    print(f"ceiling for fp32 decode on this machine: {100 * statistics.median(figs['kernel 1 matrix']) / probe:.0f} % "
          "of the read probe (one matrix-vector product over the weights' bytes, nothing else)")
    # rows: what verifying more candidates costs the kernel alone (a verify pass / tree reads each weight once)
    rows = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32)
    per = {m: [] for m in rows}
    xs = {m: torch.randn(m, k, generator=g) for m in rows}
    with torch.inference_mode():
        for _ in range(max(3, args.repeats // 3)):
            for m in rows:
                per[m].append(_best_of(lambda m=m: big_lin(xs[m]), 2))
    base = statistics.median(per[1])
    print("kernel over the big matrix, rows -> median ms (x one row): " + ", ".join(
        f"{m}: {1e3 * statistics.median(per[m]):.1f} ({statistics.median(per[m]) / base:.2f})" for m in rows))


if __name__ == "__main__":
    main()
