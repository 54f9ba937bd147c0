"""A tiny ``specledger serve`` whose engine steps slowly, for the shutdown tests.

In-process: :func:`slow_app`. As a process (real signals): ``python -m tests.draining_server PORT GRACE STEP_S``
binds 127.0.0.1:PORT, prints ``ready`` and serves until signalled -- the same :func:`serve_app` path as the CLI.
"""

from __future__ import annotations

import sys
import time

from specledger.engine.decode import Engine
from specledger.serve.app import create_app
from specledger.serve.hardening import Limits
from tests.conftest import CharTokenizer, tiny_model

CONTEXT = 256
TOKENIZER = CharTokenizer()


def slow_app(grace_s: float, step_s: float):
    """The tiny model served with ngram, each engine step ``step_s`` slower (so streams outlive a signal)."""
    engine = Engine(tiny_model(5, vocab=len(CharTokenizer.ALPHABET), n_layers=2, dim=32, max_seq_len=CONTEXT),
                    TOKENIZER, eos_token_ids=[TOKENIZER.encode("!")[0]], max_context=CONTEXT, name="tiny")
    app = create_app(engine, "ngram", 4, model_name="tiny", max_queue=16, max_batch=8,
                     encode=lambda prompt, messages: TOKENIZER.encode(prompt or "hello"),
                     limits=Limits(shutdown_grace_s=grace_s))
    worker = app.state.service.worker
    step = worker._step

    def slow_step() -> None:
        time.sleep(step_s)
        step()

    worker._step = slow_step
    return app


def stream_body(max_tokens: int = 200) -> dict:
    return {"model": "tiny", "prompt": "abc abc abc", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}


if __name__ == "__main__":
    import torch

    from specledger.serve.runner import bind_socket, serve_app

    torch.set_num_threads(1)
    port, grace, step_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    sock = bind_socket("127.0.0.1", port)
    application = slow_app(grace, step_s)
    print("ready", flush=True)
    serve_app(application, sock)
