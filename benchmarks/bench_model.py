"""Decode speed of the native model vs Hugging Face ``generate`` (prints; not a test).

    python benchmarks/bench_model.py [--tokens 128] [--repeats 3] [--threads 1 2] [--skip-hf]

Measures, on the bundled SmolLM2-135M-Instruct (converted once into the specledger cache):

- plain greedy decode tokens/s of ours (prefill with ``last_only``, then argmax T=1 steps) vs
  HF ``model.generate`` (greedy, min_new_tokens = max_new_tokens = --tokens), fp32 and bf16,
  end to end (prefill included, like ``generate``) and decode-only; median of --repeats;
- ours with oneDNN weight prepacking off (plain ``F.linear``), to show what prepacking buys;
- the verify pass: forward time for T = 1..9 positions relative to T = 1;
- weight-only int8 (``quantize_int8``) decode tokens/s;
- achieved bandwidth = (weights + KV of the mean decode context) x tokens/s
  (``engine/bandwidth.decode_line``) vs a measured machine read bandwidth (``torch.sum`` over a
  1 GiB float32 tensor) and copy bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specledger.engine.bandwidth import decode_line, requests_decode_context
from specledger.engine.int8 import quantize_int8
from specledger.engine.layers import Linear
from specledger.engine.loader import convert_gguf, default_target_path, load_model
from specledger.engine.model import Transformer

PROMPT = "Write a short story about a robot who learns to paint, in about three paragraphs."


def median_of(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def greedy_decode(model: Transformer, prompt_ids: list[int], n_tokens: int) -> tuple[list[int], float, float]:
    """(generated ids, end-to-end seconds, decode-only seconds) for prefill + n_tokens-1 T=1 steps.

    Like ``generate(max_new_tokens=n)``: the prefill yields token 1, each step one more."""
    ids = torch.tensor([prompt_ids])
    cache = model.new_cache(len(prompt_ids) + n_tokens + 1)
    with torch.inference_mode():
        t0 = time.perf_counter()
        tok = model(ids, 0, cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
        out = [int(tok)]
        t1 = time.perf_counter()
        pos = len(prompt_ids)
        for _ in range(n_tokens - 1):
            tok = model(tok, pos, cache)[:, -1].argmax(-1, keepdim=True)
            out.append(int(tok))
            pos += 1
        t2 = time.perf_counter()
    return out, t2 - t0, t2 - t1


def ours_tokens_per_s(model: Transformer, prompt_ids: list[int], n: int, repeats: int) -> tuple[float, float]:
    greedy_decode(model, prompt_ids, 8)  # warm-up (weight prepacking happens here)
    runs = [greedy_decode(model, prompt_ids, n) for _ in range(repeats)]
    e2e = statistics.median(n / r[1] for r in runs)
    decode = statistics.median((n - 1) / r[2] for r in runs)
    return e2e, decode


def hf_tokens_per_s(hf_model, prompt_ids: list[int], n: int, repeats: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt_ids])
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        hf_model.generate(ids, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})
        times, out = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = hf_model.generate(ids, **kwargs)
            times.append(time.perf_counter() - t0)
    return n / statistics.median(times), out[0, len(prompt_ids):].tolist()


def verify_ratios(model: Transformer, prompt_len: int, repeats: int = 15) -> list[float]:
    """Median forward time for T = 1..9 new positions at a fixed start, relative to T = 1."""
    cache = model.new_cache(prompt_len + 64)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=g), 0, cache)
        times = []
        for t in range(1, 10):
            toks = torch.randint(0, model.config.vocab_size, (1, t), generator=g)
            model(toks, prompt_len, cache)

            def one(toks=toks) -> float:
                t0 = time.perf_counter()
                model(toks, prompt_len, cache)
                return time.perf_counter() - t0

            times.append(median_of(one, repeats))
    return [x / times[0] for x in times], times[0]


def teacher_forced_agreement(reference: Transformer, other: Transformer, ids: list[int]) -> float:
    """Fraction of positions where both models' argmax agree on the same (reference) context."""
    x = torch.tensor([ids])
    with torch.inference_mode():
        a = reference(x, 0, reference.new_cache(len(ids))).argmax(-1)
        b = other(x, 0, other.new_cache(len(ids))).argmax(-1)
    return float((a == b).float().mean())


def machine_bandwidth_gbs() -> tuple[float, float]:
    """(read GB/s via torch.sum over 1 GiB fp32, copy GB/s counting read + write)."""
    a = torch.ones(1 << 28)
    b = torch.empty_like(a)
    a.sum()
    b.copy_(a)

    def read() -> float:
        t0 = time.perf_counter()
        a.sum()
        return time.perf_counter() - t0

    def copy() -> float:
        t0 = time.perf_counter()
        b.copy_(a)
        return time.perf_counter() - t0

    nbytes = a.numel() * 4
    return nbytes / min(read() for _ in range(5)) / 1e9, 2 * nbytes / min(copy() for _ in range(5)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    n, reps = args.tokens, args.repeats
    print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
          f"default threads {torch.get_num_threads()}")
    hf_dir = convert_gguf(default_target_path())
    for threads in args.threads:
        torch.set_num_threads(threads)
        read_bw, copy_bw = machine_bandwidth_gbs()
        print(f"\n=== threads={threads}: machine read {read_bw:.1f} GB/s, copy {copy_bw:.1f} GB/s ===")
        for dtype in ("float32", "bfloat16"):
            loaded = load_model(None, dtype=dtype)
            model, prompt_ids = loaded.model, loaded.encode_prompt(PROMPT)
            ctx = requests_decode_context([(len(prompt_ids), n)])  # the mean context of the decode steps
            ours_e2e, ours_dec = ours_tokens_per_s(model, prompt_ids, n, reps)
            ours_ids, _, _ = greedy_decode(model, prompt_ids, n)
            print(f"[{dtype}] prompt {len(prompt_ids)} tokens, weights {model.weight_bytes() / 1e6:.0f} MB/step")
            print(f"  ours          {ours_e2e:6.1f} tok/s end-to-end, {ours_dec:6.1f} tok/s decode-only "
                  f"-> {decode_line(model, ctx, ours_dec, read_bw * 1e9)}")
            Linear.prepack = False
            plain_e2e, plain_dec = ours_tokens_per_s(model, prompt_ids, n, reps)
            Linear.prepack = True
            print(f"  ours F.linear {plain_e2e:6.1f} tok/s end-to-end, {plain_dec:6.1f} tok/s decode-only "
                  f"(prepack speed-up {ours_dec / plain_dec:.2f}x)")
            if not args.skip_hf:
                from transformers import AutoModelForCausalLM

                hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).eval()
                hf_tps, hf_ids = hf_tokens_per_s(hf, prompt_ids, n, max(1, reps - 1))
                same = next((i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b), len(hf_ids))
                print(f"  HF generate   {hf_tps:6.1f} tok/s  -> ours/HF = {ours_e2e / hf_tps:.2f}x end-to-end; "
                      f"greedy tokens identical for the first {same}/{len(hf_ids)}")
                del hf
            ratios, t1 = verify_ratios(model, len(prompt_ids))
            print(f"  verify T=1..9 / T=1 (T=1 = {t1 * 1e3:.1f} ms): " + " ".join(f"{r:.2f}" for r in ratios))
            q = quantize_int8(model)
            q_e2e, q_dec = ours_tokens_per_s(q, prompt_ids, n, reps)
            q_ratios, q_t1 = verify_ratios(q, len(prompt_ids))
            agree = teacher_forced_agreement(model, q, prompt_ids + ours_ids)
            print(f"  int8          {q_e2e:6.1f} tok/s end-to-end, {q_dec:6.1f} tok/s decode-only, "
                  f"{decode_line(q, ctx, q_dec, read_bw * 1e9)}; "
                  f"teacher-forced top-1 agreement with {dtype}: {agree:.1%}")
            print(f"  int8 verify T=1..9 / T=1 (T=1 = {q_t1 * 1e3:.1f} ms): " + " ".join(f"{r:.2f}" for r in q_ratios))
            del q, model, loaded


if __name__ == "__main__":
    main()
