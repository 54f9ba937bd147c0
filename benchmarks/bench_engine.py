"""Engine benchmark: ours vs Hugging Face, side by side in one run, on the bundled SmolLM2-135M.

Greedy, natural stopping (EOS) with at most ``--max-tokens`` new tokens, on held-out prompts written
for this benchmark and never tuned on (``benchmarks/data/heldout_engine.jsonl``, 14 prompts).
Every configuration runs on every prompt in turn (A B C ... per prompt, so machine noise hits all
alike), and the machine's read bandwidth is measured between prompts in the same process.

Prints, per configuration: tokens/s (end to end: prefill + decode, total tokens / total seconds,
median over repeats), the ratio to HF ``generate`` and to our plain fp32 decode, outputs identical
to HF ``generate`` and to our plain fp32 decode, E[L] of the speculative rows, and the bandwidth
achieved by plain decoding (bytes one decode step reads -- weights + KV at the mean context -- x decode
tokens/s, i.e. the tokens after the first over the time after the first: the prefill reads the same
weights once for the whole prompt and is left out, for HF too, timed by a streamer) as a share of the
measured read bandwidth. Rows:

- HF generate fp32 / HF prompt lookup fp32 (assisted generation, 10 tokens): the references;
- ours plain fp32: the default engine (native row-invariant kernel, engine/kernels);
- ours plain fp32, oneDNN linears: the same engine with the kernel off (what the kernel buys);
- ours plain bf16: the bf16 target path (half the bytes per token);
- bare loop fp32: plain greedy with no ledger, timers or detokenisation (the instrumentation cost);
- ours ngram / suffix fp32 at gamma 4 and 8: speculative decoding vs HF prompt lookup.

    python benchmarks/bench_engine.py [--prompts 14] [--max-tokens 128] [--repeats 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specledger.engine import kernels
from specledger.engine.bandwidth import (
    decode_line,
    measure_read_bandwidth,
    request_bytes_per_token,
    requests_decode_context,
)
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.loader import convert_gguf, default_target_path, load_model

HELDOUT = Path(__file__).with_name("data") / "heldout_engine.jsonl"


def prompts(n: int, lm, path: Path = HELDOUT) -> list[list[int]]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    return [lm.encode_prompt(messages=it["messages"]) for it in items]


class FirstTokenClock:
    """An HF streamer that only notes when the first generated token arrives (``put`` gets the prompt
    first, then the new tokens), so HF's prefill can be told apart from its decode."""

    def __init__(self) -> None:
        self.calls, self.first = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_runner(hf, eos, max_tokens, **gen_kwargs):
    """Runs return (new tokens, seconds end to end, E[L] or None, seconds after the first token)."""
    def go(ids):
        inp = torch.tensor([ids])
        clock = FirstTokenClock()
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos[0], streamer=clock, **gen_kwargs)
        end = time.perf_counter()
        return out[0, len(ids):].tolist(), end - t, None, end - (clock.first or t)
    return go


def ours_runner(engine, drafter, gamma, max_tokens):
    def go(ids):
        rec = engine.generate(ids, drafter=drafter, gamma=gamma, max_tokens=max_tokens)
        full = [r for r in rec.rounds if not r.truncated]
        el = sum(r.committed for r in full) / len(full) if full else None
        return rec.token_ids, rec.total_time, el, rec.total_time - rec.ttft
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
            first = time.perf_counter()
            out = [tok]
            pos = len(ids)
            step = torch.empty((1, 1), dtype=torch.long)
            while len(out) < max_tokens and tok not in eos:
                step[0, 0] = tok
                tok = int(model(step, pos, cache)[0, -1].argmax())
                out.append(tok)
                pos += 1
        end = time.perf_counter()
        return out, end - t, None, end - first
    return go


def oneDNN_engine(dtype: str) -> Engine:
    """A second copy of the target whose linears skip the native kernel (oneDNN, as before it)."""
    engine = Engine.from_loaded(load_model(None, dtype=dtype))
    for module in engine.model.modules():
        if hasattr(module, "native"):
            module.native = False
    return engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=14)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="plain rows and ngram only (no suffix, no bf16 spec)")
    ap.add_argument("--skip-hf-assisted", action="store_true")
    ap.add_argument("--prompt-file", type=Path, default=HELDOUT)
    args = ap.parse_args()
    console = Console(width=160)
    from transformers import AutoModelForCausalLM

    hf_dir = convert_gguf(default_target_path())
    engines = {dt: Engine.from_loaded(load_model(None, dtype=dt)) for dt in ("float32", "bfloat16")}
    e32 = engines["float32"]
    lm32 = e32.loaded
    eos = lm32.eos_token_ids
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ps = prompts(args.prompts, lm32, args.prompt_file)
    mt = args.max_tokens
    # name -> (runner, model whose bytes/token it reads)
    configs: dict[str, tuple] = {"HF generate fp32": (hf_runner(hf, eos, mt), e32.model)}
    if not args.skip_hf_assisted:
        configs["HF prompt lookup fp32 (10)"] = (hf_runner(hf, eos, mt, prompt_lookup_num_tokens=10), e32.model)
    configs["ours plain fp32"] = (ours_runner(e32, make_drafter("none", e32), 0, mt), e32.model)
    dnn = oneDNN_engine("float32")
    configs["ours plain fp32, oneDNN linears"] = (ours_runner(dnn, make_drafter("none", dnn), 0, mt), dnn.model)
    e16 = engines["bfloat16"]
    configs["ours plain bf16"] = (ours_runner(e16, make_drafter("none", e16), 0, mt), e16.model)
    configs["bare loop fp32 (no instrumentation)"] = (bare_runner(e32, mt), e32.model)
    drafters = (("ngram", (4, 8)),) if args.quick else (("ngram", (4, 8)), ("suffix", (4, 8)))
    for name, gammas in drafters:
        for g in gammas:  # a fresh drafter per configuration: suffix must not learn answers across configs
            configs[f"ours {name} fp32 γ={g}"] = (ours_runner(e32, make_drafter(name, e32), g, mt), e32.model)
    if not args.quick:
        configs["ours ngram bf16 γ=4"] = (ours_runner(e16, make_drafter("ngram", e16), 4, mt), e16.model)

    console.print(f"kernel: {kernels.status()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    warm = lm32.encode_prompt("Say hello.")  # first-call allocations, packing, kernel selection
    for fn, _ in configs.values():
        fn(warm)
    results = {k: {"tok": [], "sec": [], "dtok": [], "dsec": [], "el": [], "ident_hf": 0, "ident_ours": 0, "n": 0,
                   "pairs": [], "out": [], "err": None} for k in configs}
    ref_hf: dict[int, list[int]] = {}
    ref_ours: dict[int, list[int]] = {}
    bws: list[float] = [measure_read_bandwidth()]
    for rep in range(args.repeats):
        tok_rep = dict.fromkeys(configs, 0)
        sec_rep = dict.fromkeys(configs, 0.0)
        dtok_rep = dict.fromkeys(configs, 0)  # decode only: tokens after the first, seconds after it
        dsec_rep = dict.fromkeys(configs, 0.0)
        for i, ids in enumerate(ps):
            for name, (fn, _) in configs.items():
                if results[name]["err"]:
                    continue
                try:
                    toks, dt, el, ddt = fn(ids)
                except Exception as exc:  # an HF feature missing in this transformers version
                    results[name]["err"] = str(exc).splitlines()[0][:80]
                    continue
                if name == "HF generate fp32":
                    ref_hf[i] = toks
                if name == "ours plain fp32":
                    ref_ours[i] = toks
                tok_rep[name] += len(toks)
                sec_rep[name] += dt
                dtok_rep[name] += max(0, len(toks) - 1)
                dsec_rep[name] += ddt
                if rep == 0:
                    r = results[name]
                    r["n"] += 1
                    r["out"].append((i, toks))
                    r["pairs"].append((len(ids), len(toks)))
                    if el is not None:
                        r["el"].append(el)
            bws.append(measure_read_bandwidth())
        for k in configs:
            if sec_rep[k]:
                results[k]["tok"].append(tok_rep[k])
                results[k]["sec"].append(sec_rep[k])
                results[k]["dtok"].append(dtok_rep[k])
                results[k]["dsec"].append(dsec_rep[k])

    for r in results.values():  # identity against both references, once every configuration has run
        r["ident_hf"] = sum(toks == ref_hf.get(i) for i, toks in r["out"])
        r["ident_ours"] = sum(toks == ref_ours.get(i) for i, toks in r["out"])

    def tps(k, decode=False):
        r = results[k]
        tok, sec = (r["dtok"], r["dsec"]) if decode else (r["tok"], r["sec"])
        return statistics.median(t / s for t, s in zip(tok, sec) if s > 0) if any(sec) else float("nan")

    bw = statistics.median(bws)
    base_hf, base_ours = tps("HF generate fp32"), tps("ours plain fp32")
    table = Table(title=f"SmolLM2-135M greedy, {len(ps)} held-out prompts, <= {mt} new tokens, "
                        f"median of {args.repeats}; tok/s end to end (prefill + decode)")
    cols = ("configuration", "tok/s", "× HF generate", "× our plain fp32", "= HF", "= ours fp32", "E[L]",
            "decode tok/s", "MB/token", "GB/s", "% of read bw")
    for col in cols:
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for k, (_, model) in configs.items():
        r = results[k]
        if r["err"]:
            table.add_row(k, "error: " + r["err"], *[""] * (len(cols) - 2))
            continue
        v, dv = tps(k), tps(k, decode=True)
        bpt = request_bytes_per_token(model, r["pairs"])
        el = f"{statistics.mean(r['el']):.2f}" if r["el"] else ""
        plain = k.startswith(("ours plain", "HF generate", "bare"))
        table.add_row(k, f"{v:.1f}", f"{v / base_hf:.2f}", f"{v / base_ours:.2f}", f"{r['ident_hf']}/{r['n']}",
                      f"{r['ident_ours']}/{r['n']}", el, f"{dv:.1f}", f"{bpt / 1e6:.0f}",
                      f"{bpt * dv / 1e9:.1f}" if plain else "", f"{bpt * dv / bw * 100:.0f}%" if plain else "")
    console.print(table)
    console.print(f"machine read bandwidth (torch.sum over {256} MiB, best of 8, measured {len(bws)} times "
                  f"between prompts): median {bw / 1e9:.1f} GB/s, min {min(bws) / 1e9:.1f}, max {max(bws) / 1e9:.1f}")
    for k in ("ours plain fp32", "ours plain bf16", "HF generate fp32"):
        model = configs[k][1]
        console.print(f"{k} (decode steps): "
                      f"{decode_line(model, requests_decode_context(results[k]['pairs']), tps(k, decode=True), bw)}")
    bare = tps("bare loop fp32 (no instrumentation)")
    console.print(f"instrumentation + detokenisation overhead of Engine.generate vs the bare loop: "
                  f"{(bare / base_ours - 1) * 100:+.1f}% time")
    console.print("speculative rows are exact when '= ours fp32' is n/n (greedy speculation == plain greedy); "
                  "'= HF' compares against HF's own fp32 kernels, whose rounding differs")


if __name__ == "__main__":
    main()
