"""The fake OpenAI-compatible server (tests/fake_server.py) as a program ``probe --launch`` can start:

    python -m tests.launchable_server --port PORT [--draft-max G] [--die-after N] [--exit-now]

``--draft-max 0`` (or ``--gamma``) is a plain server (no speculation counted); ``--draft-max G`` counts every
streamed chunk as one speculative round of G drafted tokens (vLLM's counter names on ``/metrics``).
``GET /health`` answers 200.
``--die-after N`` exits the process (code 3) once N requests have been served, as an engine that crashes
mid-run; ``--exit-now`` exits (code 2) before it listens, as an engine that fails to start.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

import uvicorn

from tests.fake_server import FakeServerConfig, create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gamma", "--draft-max", type=int, default=0)
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--exit-now", action="store_true")
    args = parser.parse_args(argv)
    if args.exit_now:
        print("launchable_server: failing at start as asked", file=sys.stderr, flush=True)
        sys.exit(2)
    config = FakeServerConfig(gamma=args.gamma, chunk_pattern=(1,) if args.gamma == 0 else (1, 3, 2, 4),
                              delays_s=(0.001,), crlf_every=0, response_tokens=12)
    app, log = create_app(config)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    if args.die_after:
        def watch() -> None:
            while len(log) < args.die_after:
                threading.Event().wait(0.01)
            threading.Event().wait(0.05)
            print(f"launchable_server: dying after {len(log)} requests as asked", file=sys.stderr, flush=True)
            os._exit(3)

        threading.Thread(target=watch, daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
