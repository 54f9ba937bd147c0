"""Engine benchmark: ours vs Hugging Face, side by side in one run, on the bundled SmolLM2-135M.

Greedy, natural stopping (EOS) with max 128 new tokens, >= 8 real prompts (HumanEval editing and
completion, MT-Bench dialogue). Configurations run interleaved per prompt so machine noise hits
all alike; figures are totals (tokens / seconds) and medians over repeats.

Prints: tokens/s, ratio vs HF generate and vs our plain decode, identical-output check against
HF generate, E[L], and the memory bandwidth achieved by plain decode (weight bytes per token x
tokens/s) vs the machine's measured read bandwidth.

    .venv/bin/python benchmarks/bench_engine.py [--prompts 8] [--max-tokens 128] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.loader import convert_gguf, default_target_path, load_model
from specledger.workloads import load_category


def measured_read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes/s of a streaming read (sum over a large fp32 tensor), best of ``repeats``."""
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t))
    return best


def prompts(n: int, lm) -> list[list[int]]:
    half = max(1, n // 2)
    items = load_category("code-edit", half - half // 2) + load_category("code", half // 2)
    items += load_category("dialogue", n - half)
    return [lm.encode_prompt(messages=it.messages) for it in items]


def hf_runner(hf, eos, max_tokens, **gen_kwargs):
    def go(ids):
        inp = torch.tensor([ids])
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos[0], **gen_kwargs)
        dt = time.perf_counter() - t
        toks = out[0, len(ids):].tolist()
        return toks, dt, None
    return go


def ours_runner(engine, drafter, gamma, max_tokens):
    def go(ids):
        rec = engine.generate(ids, drafter=drafter, gamma=gamma, max_tokens=max_tokens)
        full = [r for r in rec.rounds if not r.truncated]
        el = sum(r.committed for r in full) / len(full) if full else None
        return rec.token_ids, rec.total_time, el
    return go


def bare_runner(engine, max_tokens):
    """Plain greedy decode with no timers, records, detokenisation or stop bookkeeping: the
    reference for the instrumentation overhead of ``Engine.generate``."""
    model, eos = engine.model, engine.eos_token_ids

    def go(ids):
        t = time.perf_counter()
        with torch.inference_mode():
            cache = engine.cache_for(len(ids) + max_tokens + 1)
            tok = int(model(torch.tensor([ids]), 0, cache, last_only=True)[0, -1].argmax())
            out = [tok]
            pos = len(ids)
            while len(out) < max_tokens and tok not in eos:
                tok = int(model(torch.tensor([[tok]]), pos, cache)[0, -1].argmax())
                out.append(tok)
                pos += 1
        return out, time.perf_counter() - t, None
    return go


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-hf-assisted", action="store_true")
    ap.add_argument("--skip-early-exit", action="store_true", help="HF early exit runs at ~0.2x: the slowest part")
    args = ap.parse_args()
    console = Console(width=160)
    from transformers import AutoModelForCausalLM

    hf_dir = convert_gguf(default_target_path())
    configs: dict[str, object] = {}
    engines = {}
    for dtype in ("float32", "bfloat16"):
        lm = load_model(None, dtype=dtype)
        engines[dtype] = Engine.from_loaded(lm)
    lm32 = engines["float32"].loaded
    eos = lm32.eos_token_ids
    hf = {dt: AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dt)).eval() for dt in ("float32",)}
    ps = prompts(args.prompts, lm32)
    mt = args.max_tokens
    configs["HF generate fp32"] = hf_runner(hf["float32"], eos, mt)
    if not args.skip_hf_assisted:
        configs["HF prompt lookup fp32 (10)"] = hf_runner(hf["float32"], eos, mt, prompt_lookup_num_tokens=10)
        if not args.skip_early_exit:
            configs["HF early exit fp32 (layer 8)"] = hf_runner(hf["float32"], eos, mt, assistant_early_exit=8)
    for dtype, engine in engines.items():
        tag = "fp32" if dtype == "float32" else "bf16"
        configs[f"ours plain {tag}"] = ours_runner(engine, make_drafter("none", engine), 0, mt)
    e32 = engines["float32"]
    configs["bare loop fp32 (no instrumentation)"] = bare_runner(e32, mt)
    for name, gammas in (("ngram", (4, 8)), ("suffix", (4, 8)), ("layerskip", (2, 4)), ("quant-self", (2, 4))):
        layers = None
        for g in gammas:  # a fresh drafter per configuration: suffix must not learn answers across configs
            d = make_drafter(name, e32, layers=layers)
            layers = ",".join(map(str, d.layers)) if name == "layerskip" else None
            configs[f"ours {name} fp32 γ={g}"] = ours_runner(e32, d, g, mt)

    # warm-up (first-call allocations, oneDNN kernel selection) on a prompt outside the set
    warm = lm32.encode_prompt("Say hello.")
    for fn in configs.values():
        try:
            fn(warm)
        except Exception as exc:  # an HF feature missing in this transformers version
            console.print(f"[yellow]warm-up failed: {exc}[/]")
    results = {k: {"tok": [], "sec": [], "el": [], "ident": 0, "n": 0, "err": None} for k in configs}
    reference: dict[int, list[int]] = {}
    for rep in range(args.repeats):
        tok_rep = {k: 0 for k in configs}
        sec_rep = {k: 0.0 for k in configs}
        for i, ids in enumerate(ps):
            for name, fn in configs.items():
                if results[name]["err"]:
                    continue
                try:
                    toks, dt, el = fn(ids)
                except Exception as exc:
                    results[name]["err"] = str(exc).splitlines()[0][:80]
                    continue
                if name == "HF generate fp32":
                    reference[i] = toks
                tok_rep[name] += len(toks)
                sec_rep[name] += dt
                if rep == 0:
                    results[name]["n"] += 1
                    results[name]["ident"] += int(toks == reference.get(i))
                    if el is not None:
                        results[name]["el"].append(el)
        for k in configs:
            if sec_rep[k]:
                results[k]["tok"].append(tok_rep[k])
                results[k]["sec"].append(sec_rep[k])

    def tps(k):
        r = results[k]
        return statistics.median(t / s for t, s in zip(r["tok"], r["sec"])) if r["sec"] else float("nan")

    bw = measured_read_bandwidth()
    base_hf, base_ours = tps("HF generate fp32"), tps("ours plain fp32")
    table = Table(title=f"SmolLM2-135M greedy, {len(ps)} prompts, <= {mt} new tokens, median of {args.repeats}")
    for col in ("configuration", "tok/s", "× HF generate", "× our plain fp32", "identical to HF", "E[L]", "GB/s"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for k in configs:
        r = results[k]
        if r["err"]:
            table.add_row(k, "error: " + r["err"], "", "", "", "", "")
            continue
        v = tps(k)
        gbs = ""
        if k.startswith("ours plain"):
            eng = engines["float32" if "fp32" in k else "bfloat16"]
            gbs = f"{eng.model.weight_bytes() * v / 1e9:.2f}"
        el = f"{statistics.mean(r['el']):.2f}" if r["el"] else ""
        table.add_row(k, f"{v:.1f}", f"{v / base_hf:.2f}", f"{v / base_ours:.2f}", f"{r['ident']}/{r['n']}", el, gbs)
    console.print(table)
    bare = tps("bare loop fp32 (no instrumentation)")
    console.print(f"instrumentation + detokenisation overhead of Engine.generate vs the bare loop: "
                  f"{(bare / base_ours - 1) * 100:+.1f}% time")
    wb = engines["float32"].model.weight_bytes()
    console.print(f"machine read bandwidth (torch sum over 1 GiB, best of 5): {bw / 1e9:.2f} GB/s; "
                  f"fp32 weights read per token {wb / 1e6:.1f} MB -> roofline {bw / wb:.1f} tok/s; "
                  f"our plain fp32 reaches {base_ours * wb / bw * 100:.0f}% of it")


if __name__ == "__main__":
    main()
