"""Our quantized plain decode vs llama.cpp's plain decode of the same GGUF, side by side in one process.

    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--server PATH] [--max-tokens 128] [--rounds 2]
        [--prompts FILE.jsonl] [--spec ngram:4,suffix:4]

Both engines: the bundled SmolLM2-135M-Instruct Q4_1 GGUF, its own blocks kept quantized (ours: ``--dtype gguf``),
2 threads (llama-server ``-t 2``), one request at a time, greedy, the same chat-templated prompt token ids, the
same number of new tokens (``ignore_eos``). The prompts are written here and were not tuned on. Per prompt and
round, ours then llama.cpp's, alternating, so the shared machine's drift hits both alike, with a pause before each
request (``--pause``): both engines' worker threads poll for a while after a request.

Decode tok/s: ours ``(n - 1) / (total - ttft)`` (the tokens after the first, over the time after it);
llama.cpp's ``predicted_n / predicted_ms`` from its own ``timings`` (server-side, no HTTP). Both from totals over
all requests. Bandwidth: bytes per token (weights as ``weight_bytes`` counts them + the KV read at the mean context)
x our decode tok/s, against the machine's read bandwidth measured in the same run (before and after, best kept).

Exactness, in the same process: every prompt decoded again speculatively on the same quantized target with each
``--spec`` drafter:gamma, its tokens compared with our plain decode's (must be identical: the native kernels compute
a row the same way alone or in a verify pass), and its decode tok/s beside both engines' plain.
``--prompts``: a JSONL file of ``{"prompt": ...}`` lines instead of the prompts written below.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specledger.bench.sweep import parse_drafter_gammas  # noqa: E402
from specledger.engine import bandwidth  # noqa: E402
from specledger.engine.build import build_engine  # noqa: E402
from specledger.engine.drafters.registry import make_drafter  # noqa: E402
from specledger.engine.loader import cache_root, default_target_path  # noqa: E402
from specledger.engine.sampling import SamplingParams  # noqa: E402
from specledger.probe.engine_server import free_port  # noqa: E402

PROMPTS = [  # held out: written for this benchmark, not used to tune anything
    "Describe how a bicycle gear system works to a ten-year-old.",
    "Write a short Python function that counts the vowels in a string, with a docstring.",
    "What are three practical tips for keeping houseplants alive in winter?",
    "Summarize the plot of a story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple in Python.",
    "Give me a packing list for a two-day hiking trip in the mountains.",
]



def _default_server() -> Path | None:
    root = cache_root() / "llama-server"  # $SPECLEDGER_CACHE, else ~/.cache/specledger (scripts/build_llama_server.sh)
    found = sorted(root.glob("*/llama-server")) if root.is_dir() else []
    return found[-1] if found else None


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _start_server(binary: Path, model: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", "2048",
                             "-np", "1", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("llama-server did not come up")


def _load_prompts(path: Path | None) -> list[str]:
    if path is None:
        return PROMPTS
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["prompt"] for r in rows]


def _llama(base: str, ids: list[int], n: int) -> tuple[int, float, list[int]]:
    out = _post(base + "/completion", {"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1,
                                       "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
    t = out["timings"]
    return int(t["predicted_n"]), float(t["predicted_ms"]) / 1e3, list(out.get("tokens") or [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, default=_default_server())
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between requests (threads settle)")
    ap.add_argument("--prompts", type=Path, default=None, help="JSONL of {\"prompt\": ...} (default: the ones here)")
    ap.add_argument("--spec", default="ngram:4,suffix:4", help="drafter:gamma settings checked for exactness")
    args = ap.parse_args()
    if args.server is None or not args.server.is_file():
        raise SystemExit("no llama-server binary: run scripts/build_llama_server.sh (or pass --server)")
    torch.set_num_threads(args.threads)
    model_path = default_target_path()
    engine = build_engine(None, "gguf")
    spec = parse_drafter_gammas(args.spec)
    print(f"ours: {engine.name} {engine.dtype}; {engine.loaded.weights_note}")
    print(f"llama.cpp: {args.server} (-t {args.threads}); {os.cpu_count()} CPUs, shared with other jobs")
    bw_before = bandwidth.measure_read_bandwidth()
    proc, base = _start_server(args.server, model_path, args.threads)
    params = SamplingParams(temperature=0.0)
    try:
        prompts = [engine.loaded.encode_prompt(p) for p in _load_prompts(args.prompts)]
        engine.generate(prompts[0], max_tokens=8, params=params)  # warm-up, both
        _llama(base, prompts[0], 8)
        ours_tok = ours_s = ll_tok = ll_s = 0.0
        pairs, same_prefix, plain_ids = [], [], {}
        for rnd in range(args.rounds):
            for i, ids in enumerate(prompts):
                time.sleep(args.pause)  # the other engine's worker threads stop polling before this one runs
                rec = engine.generate(ids, max_tokens=args.max_tokens, params=params, ignore_eos=True)
                time.sleep(args.pause)
                n, secs, ll_ids = _llama(base, ids, args.max_tokens)
                o_tok, o_s = rec.output_tokens - 1, rec.total_time - rec.ttft
                ours_tok, ours_s, ll_tok, ll_s = ours_tok + o_tok, ours_s + o_s, ll_tok + n, ll_s + secs
                pairs.append((len(ids), rec.output_tokens))
                plain_ids.setdefault(i, rec.token_ids)
                if rnd == 0 and ll_ids:
                    k = next((j for j, (a, b) in enumerate(zip(rec.token_ids, ll_ids)) if a != b),
                             min(len(rec.token_ids), len(ll_ids)))
                    same_prefix.append(k)
                print(f"  round {rnd} prompt {i}: ours {o_tok / o_s:6.1f} tok/s   llama.cpp {n / secs:6.1f} tok/s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    spec_rows = []
    for name, gamma in spec:  # exactness: speculative decoding of the same quantized target, every prompt
        same, tok, secs = 0, 0, 0.0
        for i, ids in enumerate(prompts):
            rec = engine.generate(ids, drafter=make_drafter(name, engine), gamma=gamma, max_tokens=args.max_tokens,
                                  params=params, ignore_eos=True)
            same += rec.token_ids == plain_ids[i]
            tok, secs = tok + rec.output_tokens - 1, secs + rec.total_time - rec.ttft
        spec_rows.append((f"{name} γ={gamma}", same, tok / secs))
    bw = max(bw_before, bandwidth.measure_read_bandwidth())
    ours, ll = ours_tok / ours_s, ll_tok / ll_s
    per_token = bandwidth.request_bytes_per_token(engine.model, pairs)
    print(f"decode tok/s (totals over {len(pairs)} requests of {args.max_tokens} tokens): ours {ours:.1f}, "
          f"llama.cpp {ll:.1f}, ratio {ours / ll:.2f}x")
    print(f"bandwidth: {bandwidth.describe(per_token, ours, bw)}")
    print(f"  weights {engine.model.weight_bytes() / 1e6:.1f} MB/token; llama.cpp at the same bytes: "
          f"{per_token * ll / bw * 100:.0f}% of the measured read")
    for label, same, rate in spec_rows:
        print(f"speculative {label}: {same}/{len(prompts)} outputs token-identical to our plain decode; decode "
              f"{rate:.1f} tok/s ({rate / ours:.2f}x our plain, {rate / ll:.2f}x llama.cpp's plain)")
    if same_prefix:
        print(f"greedy outputs agree with llama.cpp's for the first {same_prefix} tokens (per prompt; different "
              "kernels round differently, so they drift apart: a quality matter, not correctness)")


if __name__ == "__main__":
    main()
