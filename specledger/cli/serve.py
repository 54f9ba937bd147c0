"""``specledger serve``: our engine behind an OpenAI-compatible API with vLLM metric names
(:mod:`specledger.serve.options`, :mod:`specledger.serve.app`)."""

from __future__ import annotations

from typing import Annotated

import typer

from specledger.engine.build import weights_line
from specledger.engine.choices import DTYPE_HELP
from specledger.engine.drafters.catalog import HEAD, MODEL, NGRAM, choices_help
from specledger.errors import SpecLedgerError
from specledger.serve.drain import DEFAULT_SHUTDOWN_GRACE_S

_TARGET_HELP = "GGUF file or HF model dir (default: bundled SmolLM2-135M)."
_DRAFT_HELP = f"Draft model path for --drafter {MODEL.name}; a .safetensors head file for {HEAD.name}."
_DEVICE_HELP = "cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = bfloat16 there)."


def serve(
    host: Annotated[str, typer.Option(help="Address to bind (default loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    target: Annotated[str | None, typer.Option(help=_TARGET_HELP)] = None,
    drafter: Annotated[str, typer.Option(
        help=choices_help())] = NGRAM.name,
    gamma: Annotated[str, typer.Option(help="Candidates per round (integer, 0 = plain) or 'heuristic'.")] = "4",
    tree_budget: Annotated[int, typer.Option(help="Token-tree nodes per round (0 = chains; depth <= gamma).")] = 0,
    layers: Annotated[str | None, typer.Option(help="layerskip layers, e.g. 12 or 0-7,26-29.")] = None,
    draft: Annotated[str | None, typer.Option(help=_DRAFT_HELP)] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    device: Annotated[str, typer.Option(help=_DEVICE_HELP)] = "cpu",
    max_queue: Annotated[int, typer.Option(help="Waiting requests beyond which the server answers 429.")] = 64,
    max_batch: Annotated[int, typer.Option(help="Requests decoded together (continuous batching).")] = 8,
    model_name: Annotated[str | None, typer.Option(help="Model id to serve as (default: the model's name).")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (bytes); above it: 413.")] = 1 << 20,
    max_connections: Annotated[int, typer.Option(help="Open connections beyond which uvicorn answers 503.")] = 1024,
    send_timeout: Annotated[float, typer.Option(
        help="Seconds a client may read nothing while the server has bytes for it; then it is dropped "
             "and its batch slot freed.")] = 30.0,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="Host header value to answer besides localhost, 127.0.0.1, [::1] and the bound address "
             "(repeatable; '*' = any). Other hosts get 421 (DNS-rebinding guard).")] = None,
    keep_records: Annotated[int, typer.Option(
        help="Keep the newest N finished requests' records in memory (for debugging; 0 = none).")] = 0,
    access_log: Annotated[bool, typer.Option(
        help="Log one line per request to stderr (control characters escaped).")] = False,
    shutdown_grace: Annotated[float, typer.Option(
        help="Seconds requests in flight may run after SIGTERM / Ctrl-C (new ones get 503); then each stream "
             "ends with an error event and [DONE]. A second signal ends them at once.")] = DEFAULT_SHUTDOWN_GRACE_S,
) -> None:
    """Serve the target with speculative decoding: /v1/completions, /v1/chat/completions, /metrics."""
    from specledger.serve.hardening import Limits
    from specledger.serve.options import (
        WILDCARD_BINDS,
        allowed_hosts,
        build_app,
        check_serve_options,
        enable_access_log,
        is_loopback,
    )
    from specledger.serve.runner import bind_socket, serve_app

    check_serve_options(port, drafter, gamma, max_queue, max_batch, max_body_bytes, max_connections, keep_records,
                        send_timeout)
    if tree_budget < 0:
        raise SpecLedgerError(f"--tree-budget must be >= 1 (0 for chains), got {tree_budget}")
    if not 0 <= shutdown_grace <= 3600:
        raise SpecLedgerError(f"--shutdown-grace must be between 0 and 3600 seconds, got {shutdown_grace:g}")
    hosts = allowed_hosts(host, allow_host)
    limits = Limits(max_body_bytes=max_body_bytes, limit_concurrency=max_connections, send_timeout_s=send_timeout,
                    allowed_hosts=hosts, shutdown_grace_s=shutdown_grace)
    sock = bind_socket(host, port)  # a port in use is one error line before the model loads or a banner prints
    if access_log:
        enable_access_log()
    engine, app = build_app(target, dtype, device, drafter=drafter, gamma=gamma, model_name=model_name,
                            max_queue=max_queue, max_batch=max_batch, layers=layers, draft=draft, limits=limits,
                            tree_budget=tree_budget, keep_records=keep_records)
    service = app.state.service
    shown_host = f"[{host}]" if ":" in host else host
    print(f"specledger serve: http://{shown_host}:{port}/v1  (model id {service.model_name!r})")
    print(f"speculation: drafter={service.drafter_name} gamma={service.gamma_label}  "
          f"dtype={engine.dtype}  context={engine.max_context}  batch={max_batch}  queue={max_queue}")
    print(weights_line(engine))
    print("metrics: /metrics (vLLM names: vllm:spec_decode_num_drafts_total, ...)")
    if not is_loopback(host):
        print(f"warning: bound to {host}: reachable from other machines; there is no authentication")
        if host in WILDCARD_BINDS and "*" not in hosts:
            print(f"note: only Host {', '.join(hosts)} answered; add --allow-host NAME for the names clients use")
    serve_app(app, sock, limits)
