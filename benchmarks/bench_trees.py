"""Token trees vs chains, side by side in one run, on the bundled SmolLM2-135M (greedy, fp32).

Prompts: ``benchmarks/data/heldout_trees.jsonl`` -- code edits and agent steps written for this
benchmark and never used to tune anything. Every configuration runs interleaved per prompt (machine
noise hits all alike); speed is total tokens / total seconds vs our plain decode in the same run.

Prints:
  1. tokens/s and speed-up of plain, the chains (ngram, suffix, layerskip at several γ, the shipped learned
     head at γ 4), the trees
     (same drafters, depth γ, node budgets), and HF assisted generation -- prompt lookup, and a layer-skip
     assistant (``generate(assistant_early_exit=N)``: HF drafts with the target's first N layers, then its
     final norm and LM head; N = the number of layers our layerskip drafter keeps, and N = 15 -- HF's
     early exit takes a prefix, ours a calibrated subset) -- with "identical to our plain" (ours) /
     "identical to HF generate" (HF) counts, E[L] and nodes/round;
  2. best tree vs best chain: the ratio of their speed-ups (target >= 1.2x);
  3. the extra cost of a tree node: one packed tree pass of 1..33 rows at a few contexts (rows -> ms,
     least-squares ms per row);
  4. the DP's predicted best shape (``ledger/trees.py`` fed with the run's measured acceptance by
     rank) vs the measured best, per drafter; beside it the DP the forecasts use (acceptance by depth x rank,
     ``predict/tree_forecast.py``), whose E[L] is the one to compare with the measured E[L].

    flock /tmp/specledger-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_trees.py [--max-tokens 96]

``--smoke``: two prompts, 12 tokens, one configuration of each kind, a 3-point row-cost table -- checks
that every path runs (about a minute), measures nothing worth quoting.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from specledger.analysis.trees import tree_round_stats
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.loader import convert_gguf, default_target_path, load_model
from specledger.engine.tree import DraftTree
from specledger.errors import SpecLedgerError
from specledger.ledger.trees import best_tree, width_per_depth
from specledger.predict.tree_forecast import dp_acceptance

DATA = Path(__file__).parent / "data" / "heldout_trees.jsonl"


def load_prompts(lm) -> list[tuple[str, list[int]]]:
    out = []
    for line in DATA.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            out.append((item["id"], lm.encode_prompt(messages=item["messages"])))
    return out


def hf_early_exit_supported() -> str | None:
    """None when the installed transformers' ``generate`` takes ``assistant_early_exit``, else why not."""
    import transformers
    from transformers import GenerationConfig

    if hasattr(GenerationConfig(), "assistant_early_exit"):
        return None
    return (f"transformers {transformers.__version__} has no assistant_early_exit in generate (added in 4.47); "
            "the HF layer-skip assistant is not timed")


def row_cost(model, contexts=(128, 512), rows=(1, 2, 5, 9, 17, 33), repeats=5) -> dict:
    """ms of one verify pass over a bushy tree of ``r`` rows (r - 1 nodes, 4 children per node)."""
    out = {}
    cache = model.new_cache(1024)
    with torch.inference_mode():
        for ctx in contexts:
            model(torch.randint(0, 1000, (1, ctx)), 0, cache)
            for r in rows:
                parents = [(i - 1) // 4 - 1 if i else -1 for i in range(r - 1)]  # 4-ary, BFS-built
                tree = DraftTree.build(list(range(10, 10 + r - 1)), parents)
                toks = [5] + tree.tokens
                best = float("inf")
                for _ in range(repeats):
                    t = time.perf_counter()
                    model.forward_tree(toks, [0] * r, tree.positions(ctx - 1), cache)
                    best = min(best, time.perf_counter() - t)
                out[(ctx, r)] = best * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="2 prompts, 12 tokens, one config of each kind")
    args = ap.parse_args()
    console = Console(width=170)
    mt = 12 if args.smoke else args.max_tokens
    lm = load_model(None, dtype="float32")
    engine = Engine.from_loaded(lm)
    prompts = load_prompts(lm)[:2] if args.smoke else load_prompts(lm)
    layers = ",".join(map(str, make_drafter("layerskip", engine).layers))  # calibrated once (built-in text)

    configs: dict[str, dict] = {"plain": {"drafter": "none", "gamma": 0, "tree": 0}}
    chains = (("ngram", (4,)), ("layerskip", (2,))) if args.smoke else \
        (("ngram", (4, 8)), ("suffix", (4, 8)), ("layerskip", (2, 4)), ("head", (4,)))
    for name, gammas in chains:
        for g in gammas:
            configs[f"{name} γ={g}"] = {"drafter": name, "gamma": g, "tree": 0}
    trees = (("ngram", ((8, 16),)), ("layerskip", ((4, 8),))) if args.smoke else \
        (("ngram", ((8, 16), (8, 32))), ("suffix", ((8, 16), (8, 32))), ("layerskip", ((4, 8), (4, 16))),
         ("head", ((4, 8), (4, 16))))
    for name, settings in trees:
        for g, b in settings:
            configs[f"{name} γ={g} tree={b}"] = {"drafter": name, "gamma": g, "tree": b}
    drafters = {k: make_drafter(c["drafter"], engine, layers=layers) for k, c in configs.items()}

    hf = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(convert_gguf(default_target_path())), dtype=torch.float32).eval()

    def hf_go(ids, **kw):
        inp = torch.tensor([ids])
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=mt, do_sample=False,
                              eos_token_id=list(lm.eos_token_ids), pad_token_id=list(lm.eos_token_ids)[0], **kw)
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    hf_configs = {} if hf is None else {"HF generate": {}, "HF prompt lookup (10)": {"prompt_lookup_num_tokens": 10},
                                        "HF prompt lookup (4)": {"prompt_lookup_num_tokens": 4}}
    early_exit_missing = hf_early_exit_supported() if hf is not None else None
    if hf is not None and early_exit_missing is None:  # HF's layer-skip assistant: the target's first N layers
        n_ours = len(layers.split(","))
        for n_layers in sorted({n_ours, 15}):
            hf_configs[f"HF early exit ({n_layers} layers, 4/round)"] = {"assistant_early_exit": n_layers,
                                                                        "num_assistant_tokens": 4}
    if args.smoke:
        hf_configs = {k: v for i, (k, v) in enumerate(hf_configs.items()) if i in (0, 2, 3)}
    warm = lm.encode_prompt("Say hello.")
    for c in configs.values():
        engine.generate(warm, drafter=make_drafter(c["drafter"], engine, layers=layers), gamma=c["gamma"],
                        max_tokens=8, tree_budget=c["tree"])
    for kw in hf_configs.values():
        hf_go(warm, **kw)

    res = {k: {"tok": 0, "sec": 0.0, "ident": 0, "rounds": [], "records": []} for k in list(configs) + list(hf_configs)}
    plain_out: dict[str, list[int]] = {}
    hf_ref = {}
    for pid, ids in prompts:
        for k, c in configs.items():
            rec = engine.generate(ids, drafter=drafters[k], gamma=c["gamma"], max_tokens=mt, tree_budget=c["tree"])
            if k == "plain":
                plain_out[pid] = rec.token_ids
            r = res[k]
            r["tok"] += rec.output_tokens
            r["sec"] += rec.total_time
            r["ident"] += rec.token_ids == plain_out[pid]
            r["rounds"] += rec.rounds
            r["records"].append(rec)
        for k, kw in hf_configs.items():
            toks, dt = hf_go(ids, **kw)
            if k == "HF generate":
                hf_ref[pid] = toks
            r = res[k]
            r["tok"] += len(toks)
            r["sec"] += dt
            r["ident"] += toks == hf_ref[pid]
        console.print(f"  done {pid}", style="dim")

    base = res["plain"]["tok"] / res["plain"]["sec"]
    table = Table(title=f"SmolLM2-135M fp32 greedy, {len(prompts)} held-out prompts (code edits + agent steps), "
                        f"<= {mt} new tokens, layerskip layers {layers}")
    for col in ("configuration", "tok/s", "S vs our plain", "identical", "E[L]", "nodes/round", "ms verify/round"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    speed = {}
    for k, r in res.items():
        v = r["tok"] / r["sec"]
        speed[k] = v / base
        st = tree_round_stats(r["rounds"]) if r["rounds"] else {}
        ref = "HF generate" if k.startswith("HF") else "our plain"
        table.add_row(k, f"{v:.1f}", f"{v / base:.3f}", f"{r['ident']}/{len(prompts)} ({ref})",
                      f"{st.get('el', float('nan')):.2f}" if st.get("rounds") else "",
                      f"{st.get('nodes_mean', float('nan')):.1f}" if st.get("rounds") else "",
                      f"{st.get('t_verify_ms_mean', float('nan')):.1f}" if st.get("rounds") else "")
    console.print(table)
    chains = {k: s for k, s in speed.items() if k in configs and configs[k]["tree"] == 0 and k != "plain"}
    trees = {k: s for k, s in speed.items() if k in configs and configs[k]["tree"] > 0}
    bc, bt = max(chains, key=chains.get), max(trees, key=trees.get)
    all_ident = all(res[k]["ident"] == len(prompts) for k in configs)
    console.print(f"[bold]best tree {bt}: S={trees[bt]:.3f}; best chain {bc}: S={chains[bc]:.3f}; "
                  f"tree / chain = {trees[bt] / chains[bc]:.3f}x (target >= 1.2x); every config of ours identical to "
                  f"plain: {all_ident}[/]")
    if early_exit_missing:
        console.print(f"[yellow]{early_exit_missing}[/]")
    for h in [k for k in hf_configs if k != "HF generate"]:
        if h in speed:
            console.print(f"best tree vs {h}: {speed[bt]:.3f} vs {speed[h]:.3f} (each vs its own plain: ours vs our "
                          f"plain; HF's tok/s {res[h]['tok'] / res[h]['sec']:.1f} vs HF generate "
                          f"{res['HF generate']['tok'] / res['HF generate']['sec']:.1f}); identical to HF generate "
                          f"{res[h]['ident']}/{len(prompts)}")

    # 3. extra cost per tree node
    costs = row_cost(engine.model, contexts=(128,), rows=(1, 5, 9), repeats=1) if args.smoke else row_cost(engine.model)
    ct = Table(title="one packed tree verify pass: rows (nodes + 1) -> ms (best of 5)")
    ct.add_column("context")
    rows = sorted({r for _, r in costs})
    for r in rows:
        ct.add_column(f"{r} rows", justify="right")
    ct.add_column("ms per extra row (fit)", justify="right")
    for ctx in sorted({c for c, _ in costs}):
        ms = [costs[(ctx, r)] for r in rows]
        slope = float(np.polyfit(rows[1:], ms[1:], 1)[0])
        ct.add_row(str(ctx), *[f"{m:.1f}" for m in ms], f"{slope:.3f}")
    console.print(ct)

    # 4. DP predicted best shape vs measured
    for name in sorted({c["drafter"] for c in configs.values()} - {"none"}):
        keys = [k for k in configs if configs[k]["drafter"] == name]
        tree_rounds = [rd for k in keys if configs[k]["tree"] for rd in res[k]["rounds"]]
        pooled = tree_round_stats(tree_rounds)
        pos = [max(0.0, x) for x in pooled.get("acceptance_by_rank", [])]
        if sum(pos) > 1:
            pos = [x / sum(pos) for x in pos]
        lines = []
        best_pred = None
        records = [rec for k in keys for rec in res[k]["records"]]
        for k in keys:
            c = configs[k]
            nodes = c["tree"] or c["gamma"]
            st = tree_round_stats(res[k]["rounds"])
            dp = best_tree(pos, nodes, max_depth=c["gamma"]) if sum(pos) > 0 else None
            try:  # the forecasts' own DP: p by depth x rank over every verified tree and chain of the drafter
                dd = dp_acceptance(records, nodes, c["gamma"])
            except SpecLedgerError:  # it never proposed
                dd = None
            pred_s = speed[k] * dp.expected_length / st["el"] if dp and st.get("el") else None
            if pred_s is not None and (best_pred is None or pred_s > best_pred[1]):
                best_pred = (k, pred_s, width_per_depth(dp.shape))
            lines.append(f"{k}: measured E[L] {st.get('el', float('nan')):.2f} widths "
                         f"{[round(w, 1) for w in st.get('widths_mean', [])]} | DP E[L] "
                         f"{dp.expected_length if dp else float('nan'):.2f} widths "
                         f"{width_per_depth(dp.shape) if dp else []}"
                         f" | DP by depth x rank E[L] {dd.el if dd else float('nan'):.2f} widths "
                         f"{[int(w) for w in dd.widths] if dd else []}")
        best_meas = max(keys, key=lambda k: speed[k])
        console.print(f"[bold]{name}[/]: acceptance by rank {[round(x, 3) for x in pos]}")
        for line in lines:
            console.print("   " + line)
        console.print(f"   measured best: {best_meas} (S {speed[best_meas]:.3f}); DP's pick: "
                      f"{best_pred[0] if best_pred else None} with shape {best_pred[2] if best_pred else None}")
    console.print(f"our plain {base:.1f} tok/s; {time.strftime('%Y-%m-%d %H:%M')}; "
                  f"torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
