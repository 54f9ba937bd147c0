"""Why the served step is slower than the in-process one: the same plain decode on the main thread and on another.

    GOMP_SPINCOUNT=1000 .venv/bin/python benchmarks/diag_thread_step.py [--threads 2] [--repeats 3]

`specledger serve` decodes on a worker thread (the event loop owns the main one). This prints the in-process plain
step (ms per token after the first, 64 tokens, the default weights) on the main thread and on a fresh Python thread,
at the given torch thread count and at one thread, alternating, so the machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specledger.engine.build import build_engine  # noqa: E402

PROMPT = "Explain how a refrigerator keeps food cold, in detail."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    engine = build_engine(None, "auto")
    ids = engine.loaded.encode_prompt(PROMPT, chat=True)

    def step_ms() -> float:
        times = engine.generate(ids, max_tokens=64, ignore_eos=True).token_times
        return 1e3 * (times[-1] - times[0]) / (len(times) - 1)

    def on_thread() -> float:
        out: list[float] = []
        worker = threading.Thread(target=lambda: out.append(step_ms()))
        worker.start()
        worker.join()
        return out[0]

    step_ms()  # warm-up
    for n in (a.threads, 1):
        torch.set_num_threads(n)
        main_ms, thread_ms = [], []
        for _ in range(a.repeats):
            main_ms.append(step_ms())
            thread_ms.append(on_thread())
        m, t = statistics.median(main_ms), statistics.median(thread_ms)
        print(f"{n} thread(s): main {m:.2f} ms, other thread {t:.2f} ms ({t / m:.2f}x)")


if __name__ == "__main__":
    main()
