"""The soak's server process: ``specledger serve`` itself (:func:`specledger.cli.serve.serve`: option
checks, create_app, the uvicorn configuration and transport limits) with the engine builder
swapped for the tiny test model (character tokenizer, its own "chat template"). Run as
``python tests/soak_server.py PORT_FILE``: it picks a free loopback port, writes it to PORT_FILE
and serves until SIGTERM (uvicorn's graceful shutdown, which stops the engine worker); once the
worker has stopped it prints one ``soak-state {json}`` line: what the app still holds (records, aborted rounds,
batch steps, jobs running / waiting / taken / reserved), for the test's "nothing left behind". The test
imports :func:`soak_engine` for the solo references, so both sides decode the same model.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from specledger.engine.decode import Engine  # noqa: E402
from tests.conftest import CharTokenizer, tiny_model  # noqa: E402

MODEL = "tiny-soak"
CONTEXT = 256
MAX_BATCH = 8
MAX_QUEUE = 64
MAX_BODY_BYTES = 64 * 1024
SEND_TIMEOUT_S = 2.0
TOKENIZER = CharTokenizer()


def soak_engine() -> Engine:
    vocab = len(CharTokenizer.ALPHABET)
    return Engine(tiny_model(5, vocab=vocab, n_layers=2, dim=32, max_seq_len=CONTEXT), TOKENIZER,
                  eos_token_ids=[TOKENIZER.encode("!")[0]], max_context=CONTEXT, name="tiny")


def soak_encoder(prompt: str | None, messages: list[dict] | None) -> list[int]:
    if messages is not None:
        prompt = "; ".join(f"{m['role']}: {m['content']}" for m in messages) + "; assistant:"
    return TOKENIZER.encode(prompt)


class SoakLoaded:
    """The slice of LoadedModel that serve's encoder uses, over the character tokenizer."""

    def encode_prompt(self, prompt: str | None = None, messages: list[dict] | None = None, chat: bool = True):
        return soak_encoder(None if chat else prompt, messages if chat else None)


def held_state(app) -> dict[str, int]:
    """What the app still holds in memory / in flight (all 0 after a clean soak with no --keep-records)."""
    service = app.state.service
    worker, queue = service.worker, service.queue
    return {"records": len(worker.records), "aborted_rounds": len(worker.aborted_rounds),
            "steps": len(worker.batch.steps), "running": len(worker.active), "waiting": len(queue),
            "taken": queue.taken, "reserved": queue.reserved}


def main(port_file: str) -> None:
    import specledger.engine.build as engine_build
    import specledger.serve.app as serve_app
    from specledger.cli.serve import serve

    real_create_app = serve_app.create_app

    def create_app(*args, **kwargs):
        app = real_create_app(*args, **kwargs)
        worker = app.state.service.worker
        real_stop = worker.stop

        def stop(timeout: float = 10.0) -> None:  # lifespan shutdown: the last code that runs (uvicorn
            real_stop(timeout)  # then re-raises SIGTERM), so the state is printed here
            print("soak-state " + json.dumps(held_state(app)), flush=True)

        worker.stop = stop
        return app

    serve_app.create_app = create_app  # serve() imports it at call time

    torch.set_num_threads(1)

    def build_engine(target: str | None = None, dtype: str = "auto") -> Engine:
        engine = soak_engine()
        engine.loaded = SoakLoaded()
        return engine

    engine_build.build_engine = build_engine  # serve() imports it at call time
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Path(port_file).write_text(str(port))
    serve(host="127.0.0.1", port=port, drafter="ngram", gamma="4", max_queue=MAX_QUEUE, max_batch=MAX_BATCH,
          model_name=MODEL, max_body_bytes=MAX_BODY_BYTES, send_timeout=SEND_TIMEOUT_S)


if __name__ == "__main__":
    main(sys.argv[1])
