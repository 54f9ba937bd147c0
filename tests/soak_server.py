"""The soak's server process: ``specledger serve``'s app (create_app) behind ``specledger serve``'s
uvicorn configuration and transport limits (hardening.uvicorn_config), on the tiny test model
instead of a GGUF file. Run as ``python tests/soak_server.py PORT_FILE``: it binds 127.0.0.1 on a
free port, writes the port to PORT_FILE and serves until SIGTERM (uvicorn's graceful shutdown,
which stops the engine worker). The test imports :func:`soak_engine` for the solo references, so
both sides decode the same model.
"""

from __future__ import annotations

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
TOKENIZER = CharTokenizer()


def soak_engine() -> Engine:
    vocab = len(CharTokenizer.ALPHABET)
    return Engine(tiny_model(5, vocab=vocab, n_layers=2, dim=32, max_seq_len=CONTEXT), TOKENIZER,
                  eos_token_ids=[TOKENIZER.encode("!")[0]], max_context=CONTEXT, name="tiny")


def soak_encoder(prompt: str | None, messages: list[dict] | None) -> list[int]:
    if messages is not None:
        prompt = "; ".join(f"{m['role']}: {m['content']}" for m in messages) + "; assistant:"
    return TOKENIZER.encode(prompt)


def main(port_file: str) -> None:
    import uvicorn

    from specledger.serve.app import create_app
    from specledger.serve.hardening import Limits, uvicorn_config

    torch.set_num_threads(1)
    limits = Limits(max_body_bytes=MAX_BODY_BYTES)
    app = create_app(soak_engine(), "ngram", 4, model_name=MODEL, max_queue=MAX_QUEUE, max_batch=MAX_BATCH,
                     encode=soak_encoder, limits=limits)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn_config(app, limits=limits)).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1])
