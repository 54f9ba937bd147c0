"""The learned head vs layerskip on held-out dialogue, and the head re-checked on the int8 target (seed 6.1).

    flock /tmp/specledger-bench.lock nice -n 5 python benchmarks/bench_head.py [--max-tokens 48] [--gamma 4] \
        [--tree-budgets 0,8] [--head FILE.safetensors]

Prompts: ``benchmarks/data/dialogue_heldout.jsonl`` (written for this benchmark, never trained or
tuned on). One run, side by side, greedy: plain decoding, layerskip (calibrated layers) and the
head on the fp32 target; plain and the same head file on the weight-only int8 target. Every
speculative output is checked token-identical to plain greedy of the same target. Printed per
setting: E[L] (committed tokens per full round), acceptance per proposed token, draft and
verify ms per round, and S = plain decode time / speculative decode time (prefill excluded,
the same for both). The head's E[L] / layerskip's E[L] is the issue's target (>= 1.5), printed per chain and per
tree budget (``--tree-budgets``: both drafters expand their own top-k per node, EAGLE-2 best-first, depth
<= gamma; the head is meant to be deployed in trees, as EAGLE is).

What the reduced draft vocabulary buys: the target's lm_head (vocabulary x dim, tied) is a fifth of
its weights on this CPU, and a head step reads it once per drafted token. Printed: one lm_head row
over the full vocabulary vs over the head's draft vocabulary (median ms of a single-row matvec in
the target's dtype), one whole head step with each (layer + fc + that lm_head), and the share of
the target's held-out greedy tokens that fall outside the draft vocabulary (never proposable). The same
head also runs over the full vocabulary (``fp32 head full vocab``: the same trained layer, the target's whole
LM head per draft step) so that both sides of that trade are measured: acceptance and S.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data" / "dialogue_heldout.jsonl"


def _run(engine, prompts, drafter, gamma, max_tokens, tree_budget=0):
    recs = [engine.generate(p, drafter=drafter, gamma=gamma if drafter is not None else 0, max_tokens=max_tokens,
                            tree_budget=tree_budget if drafter is not None else 0)
            for p in prompts]
    full = [r for rec in recs for r in rec.rounds if not r.truncated]
    decode = sum(rec.total_time - rec.t_prefill for rec in recs)
    return recs, {
        "E[L]": sum(r.committed for r in full) / max(1, len(full)),
        "accept/proposed": sum(r.accepted for r in full) / max(1, sum(r.proposed for r in full)),
        "draft_ms": 1e3 * sum(r.t_draft for r in full) / max(1, len(full)),
        "verify_ms": 1e3 * sum(r.t_verify for r in full) / max(1, len(full)),
        "decode_s": decode, "tokens": sum(rec.output_tokens for rec in recs),
    }


def _median_ms(fn, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[reps // 2]


@torch.inference_mode()
def _vocab_costs(model, head, outputs: list[int]) -> dict:
    """lm_head and head-step cost with the full vs the draft vocabulary; outputs outside the draft vocabulary."""
    feat = torch.randn(model.config.dim, dtype=model.dtype)
    full_ms = _median_ms(lambda: model.lm_head(feat[None, None]))
    draft_ms = _median_ms(lambda: head.lm_head(feat[None, None]))
    net, kv = head.net, torch.zeros(2, 1, head.net.hc.n_kv_heads, 64, head.net.hc.head_dim, dtype=model.dtype)
    emb = model.embed(torch.tensor([[1]]))
    layer_ms = _median_ms(lambda: net(emb, feat[None, None], kv, 10))
    ids = set() if head.vocab_ids is None else set(head.vocab_ids.tolist())
    outside = sum(1 for t in outputs if ids and t not in ids) / max(1, len(outputs))
    return {"full_vocab": model.config.vocab_size, "draft_vocab": len(ids) or model.config.vocab_size,
            "lm_head_full_ms": full_ms, "lm_head_draft_ms": draft_ms, "layer_ms": layer_ms,
            "step_full_ms": layer_ms + full_ms, "step_draft_ms": layer_ms + draft_ms, "outside_share": outside}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tree-budgets", default="0", help="comma list of tree budgets (candidate nodes per round, "
                    "depth <= gamma; 0 = chain) at which layerskip and the head are compared on the fp32 target")
    ap.add_argument("--head", type=Path, default=None, help="head file (default: the one --drafters head finds)")
    args = ap.parse_args()
    from specledger.engine.decode import Engine
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.int8 import quantize_int8
    from specledger.engine.loader import load_model

    torch.set_num_threads(1)
    lm = load_model()
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    prompts = [lm.encode_prompt(messages=it["messages"]) for it in items]
    fp32 = Engine.from_loaded(lm)
    q = quantize_int8(lm.model)
    int8 = Engine(q, lm.tokenizer, lm.eos_token_ids, lm.max_context, lm.name, "int8")
    layerskip = make_drafter("layerskip", fp32)
    from specledger.engine.drafters.head import make_head_drafter

    head = make_head_drafter(fp32.model, args.head) if args.head else make_drafter("head", fp32)
    head_full = make_head_drafter(fp32.model, args.head or head.head.path, full_vocab=True)
    head_int8 = make_head_drafter(int8.model, args.head) if args.head else make_drafter("head", int8)
    for eng, d in ((fp32, None), (fp32, layerskip), (fp32, head), (fp32, head_full), (int8, None), (int8, head_int8)):
        eng.generate(prompts[0], drafter=d, gamma=args.gamma if d else 0, max_tokens=8)  # warm-up
    t0 = time.time()
    rows = {}
    plain_recs, rows["fp32 plain"] = _run(fp32, prompts, None, 0, args.max_tokens)
    budgets = sorted({0, *(int(b) for b in args.tree_budgets.split(",") if b.strip())})  # the chain always
    for b in budgets:
        for name, d in (("fp32 layerskip", layerskip), ("fp32 head", head), ("fp32 head full vocab", head_full)):
            name += f" tree {b}" if b else ""
            recs, rows[name] = _run(fp32, prompts, d, args.gamma, args.max_tokens, b)
            assert [r.token_ids for r in recs] == [r.token_ids for r in plain_recs], f"{name}: outputs differ"
    plain8, rows["int8 plain"] = _run(int8, prompts, None, 0, args.max_tokens)
    recs, rows["int8 head"] = _run(int8, prompts, head_int8, args.gamma, args.max_tokens)
    assert [r.token_ids for r in recs] == [r.token_ids for r in plain8], "int8 head: outputs differ"
    for name, row in rows.items():
        base = rows["int8 plain" if name.startswith("int8") else "fp32 plain"]
        row["S"] = base["decode_s"] / row["decode_s"]
    print(f"{len(prompts)} held-out dialogue prompts, max_tokens {args.max_tokens}, gamma {args.gamma}, "
          f"layerskip layers {layerskip.layers}, head {head.head.path.name} "
          f"(draft vocab {0 if head.vocab_ids is None else len(head.vocab_ids)}); outputs identical to plain")
    print(f"{'setting':<24}{'E[L]':>7}{'acc/prop':>10}{'draft ms':>10}{'verify ms':>11}{'decode s':>10}{'S':>7}")
    for name, r in rows.items():
        print(f"{name:<24}{r['E[L]']:>7.3f}{r['accept/proposed']:>10.3f}{r['draft_ms']:>10.2f}{r['verify_ms']:>11.2f}"
              f"{r['decode_s']:>10.2f}{r['S']:>7.3f}")
    for b in budgets:
        sfx = f" tree {b}" if b else ""
        h, ls = rows["fp32 head" + sfx], rows["fp32 layerskip" + sfx]
        hf = rows["fp32 head full vocab" + sfx]
        print(f"{'chain' if not b else f'tree budget {b}'}: head E[L] / layerskip E[L] = {h['E[L]'] / ls['E[L]']:.3f} "
              f"(full vocabulary {hf['E[L]'] / ls['E[L]']:.3f}; issue target >= 1.5); S head {h['S']:.3f} "
              f"(full vocabulary {hf['S']:.3f}) vs layerskip {ls['S']:.3f}")
    rows["vocab"] = _vocab_costs(fp32.model, head, [t for r in plain_recs for t in r.token_ids])
    v = rows["vocab"]
    print(f"lm_head row: full {v['full_vocab']} tokens {v['lm_head_full_ms']:.3f} ms, draft vocab {v['draft_vocab']} "
          f"{v['lm_head_draft_ms']:.3f} ms; head step {v['step_full_ms']:.3f} ms with the full vocabulary vs "
          f"{v['step_draft_ms']:.3f} ms reduced (a plain target step "
          f"{1e3 * rows['fp32 plain']['decode_s'] / max(1, rows['fp32 plain']['tokens']):.2f} ms); "
          f"{100 * v['outside_share']:.1f} % of the plain outputs' tokens are outside the draft vocabulary")
    print(f"head E[L] int8 / fp32 = {rows['int8 head']['E[L]'] / rows['fp32 head']['E[L]']:.3f} "
          f"(seed 6.1: a hidden-state head re-checked on the quantized target)")
    print(f"wall {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
