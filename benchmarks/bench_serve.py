"""Our server against llama.cpp's, end to end, as a user deploys them; and our server against our own engine.

    .venv/bin/python benchmarks/bench_serve.py [--server PATH] [--loads 1,4] [--requests 12] [--max-tokens 96]
        [--rounds 2] [--prompts FILE.jsonl] [--threads 2]

Three things run side by side in one session on the same machine, rounds alternating so that the machine's drift
hits all alike:

- ``specledger serve --drafter none`` with its DEFAULTS (no ``--dtype``: whatever ``auto`` loads);
- the project's ``llama-server`` (``make llama-server``: built for this CPU) on the same GGUF, ``-t THREADS``,
  ``--parallel`` = the largest load, plain;
- our engine in process (``Engine.generate``, the same default weights): the plain step the server should reach.

The same client for both servers: streamed chat completions (``temperature 0``, ``ignore_eos``, ``max_tokens``
new tokens each), ``load`` requests in flight (closed loop), every chunk timed on arrival. Per load: output tok/s
= all tokens / the wall time of the load's requests; TPOT per request = (last chunk - first chunk) / (tokens - 1),
its median over requests. The in-process step: (decode time after the first token) / (tokens - 1), median over the
prompts. Figures are ratios measured in one run; absolute times on this shared machine mean little.
``--prompts``: a JSONL file of ``{"prompt": ...}`` lines (default: the held-out chat prompts below, written for this
benchmark and not used to tune anything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GOMP_SPINCOUNT", "1000")  # the in-process engine as `specledger generate` runs it (cli/__init__)

from specledger.engine.loader import cache_root, default_target_path  # noqa: E402
from specledger.probe.engine_server import EngineServer, free_port  # noqa: E402

PROMPTS = [  # held out: written for this benchmark before its first run; nothing was tuned on them
    "How do tides work, and why are there two a day?",
    "Write a haiku about a train station at night, then explain its imagery.",
    "List the steps to change a flat tyre on a bicycle.",
    "What should I consider when choosing a first programming language?",
    "Describe a typical day of a beekeeper in early summer.",
    "Explain what a hash table is to someone who knows arrays.",
    "Give three arguments for and against working from home.",
    "Tell a short story about a cat who learns to open doors.",
]


def _default_server() -> Path | None:
    root = cache_root() / "llama-server"
    found = sorted(root.glob("*/llama-server"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    return found[-1] if found else None


def _stream(url: str, prompt: str, max_tokens: int) -> tuple[list[float], int]:
    """One streamed chat completion: the arrival time of every content chunk, and the tokens the server counted
    (``usage``; the chunk count when it sends none)."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    times: list[float] = []
    usage = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = int(chunk["usage"].get("completion_tokens") or 0)
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                times.append(time.perf_counter())
    return times, usage or len(times)


def _load(url: str, prompts: list[str], load: int, max_tokens: int) -> dict:
    """``prompts`` with ``load`` in flight (closed loop): output tok/s over the wall time, TPOT P50 over requests."""
    todo = list(enumerate(prompts))
    lock = threading.Lock()
    tpots: list[float] = []
    tokens = [0]

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                _, prompt = todo.pop(0)
            times, n = _stream(url, prompt, max_tokens)
            with lock:
                tokens[0] += n
                if len(times) > 1 and n > 1:
                    tpots.append((times[-1] - times[0]) / (n - 1))

    start = time.perf_counter()
    workers = [threading.Thread(target=client) for _ in range(load)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    return {"tok_s": tokens[0] / wall, "tpot_ms": 1e3 * statistics.median(tpots), "tokens": tokens[0]}


def _engine_step_ms(engine, prompts: list[str], max_tokens: int) -> float:
    """Median over ``prompts`` of the in-process plain step: decode time after the first token / (tokens - 1)."""
    steps = []
    for p in prompts:
        ids = engine.loaded.encode_prompt(p, chat=True)
        rec = engine.generate(ids, max_tokens=max_tokens, ignore_eos=True)
        times = rec.token_times
        steps.append(1e3 * (times[-1] - times[0]) / max(1, len(times) - 1))
    return statistics.median(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", type=Path, default=_default_server())
    ap.add_argument("--loads", default="1,4")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=Path)
    a = ap.parse_args()
    if a.server is None or not a.server.exists():
        raise SystemExit("no llama-server: run `make llama-server` (or pass --server PATH)")
    prompts = ([json.loads(line)["prompt"] for line in a.prompts.read_text().splitlines() if line.strip()]
               if a.prompts else PROMPTS)
    prompts = (prompts * (1 + a.requests // len(prompts)))[: a.requests]
    loads = [int(x) for x in a.loads.split(",")]
    gguf = default_target_path()

    logs = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    ours_port, llama_port = free_port(), free_port()
    ours = EngineServer("ours", [str(ROOT / ".venv/bin/specledger"), "serve", "--drafter", "none", "--port",
                                 str(ours_port), "--max-batch", str(max(loads))], ours_port, logs / "ours.log")
    llama_env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}  # llama.cpp as its users run it
    llama = EngineServer("llama.cpp", [str(a.server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(llama_port),
                                       "-t", str(a.threads), "-tb", str(a.threads), "-np", str(max(loads)),
                                       "-c", str(1024 * max(loads)), "--no-webui"], llama_port,
                         logs / "llama.log", env=llama_env)
    urls = {"ours": ours.url, "llama.cpp": llama.url}
    try:
        for server in (llama, ours):
            server.start()
            server.wait_ready(300)
        # the startup lines: which weights `auto` loaded, and why (the log's first line is the command)
        print("\n".join(ours.log_path.read_text().splitlines()[1:4]))
        print((a.server.parent / "BUILD_INFO").read_text() if (a.server.parent / "BUILD_INFO").exists() else "")
        from specledger.engine.build import build_engine

        engine = build_engine(None, "auto")
        print(f"in-process engine: {engine.dtype} ({engine.dtype_reason})")
        for url in urls.values():  # warm-up
            _load(url, prompts[:2], 1, 16)
        _engine_step_ms(engine, prompts[:1], 16)
        results: dict[tuple[str, int], list[dict]] = {}
        steps: list[float] = []
        for r in range(a.rounds):
            for load in loads:
                order = ["ours", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "ours"]
                for name in order:
                    results.setdefault((name, load), []).append(_load(urls[name], prompts, load, a.max_tokens))
            steps.append(_engine_step_ms(engine, prompts[: max(2, len(prompts) // 2)], a.max_tokens))
        step = statistics.median(steps)
        print(f"\nin-process plain step (median of rounds): {step:.2f} ms")
        print(f"{'load':>4}  {'ours tok/s':>10}  {'llama tok/s':>11}  {'ratio':>6}  {'ours TPOT':>9}  "
              f"{'llama TPOT':>10}  {'ours TPOT / step':>16}")
        for load in loads:
            o, ll = results[("ours", load)], results[("llama.cpp", load)]
            o_tps = statistics.median(x["tok_s"] for x in o)
            l_tps = statistics.median(x["tok_s"] for x in ll)
            o_tpot = statistics.median(x["tpot_ms"] for x in o)
            l_tpot = statistics.median(x["tpot_ms"] for x in ll)
            print(f"{load:>4}  {o_tps:>10.1f}  {l_tps:>11.1f}  {o_tps / l_tps:>5.2f}x  {o_tpot:>7.2f}ms  "
                  f"{l_tpot:>8.2f}ms  {o_tpot / step:>15.2f}x")
    finally:
        for server in (ours, llama):
            server.stop()

if __name__ == "__main__":
    main()
