"""Batching benchmark on the bundled SmolLM2-135M (fp32, greedy), side by side in one run:

- batching gain: plain decoding throughput through the continuous-batching engine at
  concurrency 16 vs concurrency 1 (same 16 requests);
- speculation under load: speed-up of ngram (gamma 4) and layerskip (gamma 3) over plain at
  concurrency 1 vs 16 -- the seed's §5 claim that gains on an idle server shrink under load.

    .venv/bin/python benchmarks/bench_batching.py [--requests 16] [--max-tokens 64]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from specledger.bench.serving import run_point
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.loader import load_model
from specledger.workloads import load_category


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    engine = Engine.from_loaded(load_model(None, dtype="float32"))
    items = load_category("code-edit", args.requests // 2) + load_category(
        "dialogue", args.requests - args.requests // 2
    )
    prompts = [engine.loaded.encode_prompt(messages=it.messages) for it in items]
    layers = ",".join(map(str, make_drafter("layerskip", engine).layers))
    settings = [("plain", "none", 0), ("ngram γ=4", "ngram", 4), (f"layerskip[{layers}] γ=3", "layerskip", 3)]
    eos = sorted(engine.eos_token_ids)
    rows = {}
    for conc in (1, 16):
        for label, name, g in settings:
            def factory(n=name):
                return make_drafter(n, engine, layers=layers)
            _, m = run_point(engine.model, prompts, factory, g, args.max_tokens, conc, eos=eos)
            rows[(conc, label)] = m
    t = Table(title=f"continuous batching, {len(prompts)} requests, <= {args.max_tokens} tokens, fp32 greedy")
    for col in ("concurrency", "setting", "tok/s", "speed-up vs plain", "E[L]", "mean batch", "TPOT P50 ms",
                "ITL chunk P99 ms", "forward ms/step"):
        t.add_column(col, justify="right")
    for (conc, label), m in rows.items():
        base = rows[(conc, "plain")]["throughput_tok_s"]
        t.add_row(str(conc), label, f"{m['throughput_tok_s']:.1f}", f"{m['throughput_tok_s'] / base:.2f}",
                  f"{m['el']:.2f}", f"{m['mean_batch']:.1f}", f"{m['tpot_ms']['p50']:.1f}",
                  f"{m['itl_chunk_ms']['p99']:.1f}", f"{m['t_forward_ms_per_step']:.1f}")
    console = Console(width=160)
    console.print(t)
    gain = rows[(16, "plain")]["throughput_tok_s"] / rows[(1, "plain")]["throughput_tok_s"]
    console.print(f"batching gain (plain, concurrency 16 vs 1): {gain:.2f}x")
    for label, _, _ in settings[1:]:
        s1 = rows[(1, label)]["throughput_tok_s"] / rows[(1, "plain")]["throughput_tok_s"]
        s16 = rows[(16, label)]["throughput_tok_s"] / rows[(16, "plain")]["throughput_tok_s"]
        console.print(f"{label}: speed-up {s1:.2f}x at concurrency 1 -> {s16:.2f}x at concurrency 16")


if __name__ == "__main__":
    main()
