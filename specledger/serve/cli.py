"""``specledger serve``: our engine behind an OpenAI-compatible API with vLLM metric names."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from specledger.engine.choices import DTYPE_HELP
from specledger.errors import SpecLedgerError

LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


WILDCARD_BINDS = {"0.0.0.0", "::", ""}


def allowed_hosts(host: str, extra: list[str] | None) -> tuple[str, ...]:
    """The Host names the server answers: the loopback names, the address it is bound to (unless a
    wildcard such as 0.0.0.0, which names no host), and every ``--allow-host`` ("*": any)."""
    from specledger.serve.hardening import LOOPBACK_HOSTS, host_name

    names = list(LOOPBACK_HOSTS)
    if host not in WILDCARD_BINDS:
        names.append(host_name(host) if host.startswith("[") else host.lower())
    for name in extra or []:
        if not name.strip():
            raise SpecLedgerError("--allow-host needs a host name (or * for any)")
        names.append(name.strip())
    return tuple(dict.fromkeys(names))


def check_serve_options(port: int, drafter: str, gamma: str, max_queue: int, max_batch: int = 8,
                        max_body_bytes: int = 1 << 20, max_connections: int = 1024, keep_records: int = 0,
                        send_timeout: float = 30.0) -> None:
    """Reject bad options before the (slow) model load."""
    from specledger.engine.drafters.registry import DRAFTERS
    from specledger.serve.app import parse_gamma

    if not 0 <= port <= 65535:
        raise SpecLedgerError(f"--port must be in 0..65535, got {port}")
    if drafter not in DRAFTERS:
        raise SpecLedgerError(f"unknown drafter {drafter!r}; choose one of: {', '.join(DRAFTERS)}")
    parse_gamma(gamma)
    if max_queue < 1:
        raise SpecLedgerError(f"--max-queue must be >= 1, got {max_queue}")
    if max_batch < 1:
        raise SpecLedgerError(f"--max-batch must be >= 1, got {max_batch}")
    if max_body_bytes < 1024:
        raise SpecLedgerError(f"--max-body-bytes must be >= 1024, got {max_body_bytes}")
    if keep_records < 0:
        raise SpecLedgerError(f"--keep-records must be >= 0 (0 keeps none), got {keep_records}")
    if not send_timeout > 0:
        raise SpecLedgerError(f"--send-timeout must be > 0 seconds, got {send_timeout}")
    if max_connections < max_queue + max_batch:
        raise SpecLedgerError(f"--max-connections ({max_connections}) must be >= --max-queue + --max-batch "
                              f"({max_queue + max_batch}), or admitted requests would be refused")


def serve(
    host: Annotated[str, typer.Option(help="Address to bind (default loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")] = None,
    drafter: Annotated[str, typer.Option(help="none | ngram | suffix | layerskip | quant-self | model | head")] = "ngram",
    gamma: Annotated[str, typer.Option(help="Candidates per round (integer, 0 = plain) or 'heuristic'.")] = "4",
    tree_budget: Annotated[int, typer.Option(help="Token-tree nodes per round (0 = chains; depth <= gamma).")] = 0,
    layers: Annotated[str | None, typer.Option(help="layerskip layers, e.g. 12 or 0-7,26-29.")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model path for --drafter model; a .safetensors head file for head.")] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    device: Annotated[str, typer.Option(help="cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = bfloat16 there).")] = "cpu",
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
) -> None:
    """Serve the target with speculative decoding: /v1/completions, /v1/chat/completions, /metrics."""
    import uvicorn

    from specledger.engine.build import build_engine
    from specledger.serve.app import create_app
    from specledger.serve.hardening import Limits, uvicorn_config

    check_serve_options(port, drafter, gamma, max_queue, max_batch, max_body_bytes, max_connections, keep_records,
                        send_timeout)
    if tree_budget < 0:
        raise SpecLedgerError(f"--tree-budget must be >= 1 (0 for chains), got {tree_budget}")
    hosts = allowed_hosts(host, allow_host)
    limits = Limits(max_body_bytes=max_body_bytes, limit_concurrency=max_connections, send_timeout_s=send_timeout,
                    allowed_hosts=hosts)
    if access_log:
        enable_access_log()
    engine = build_engine(target, dtype) if device == "cpu" else build_engine(target, dtype, device)
    app = create_app(engine, drafter_name=drafter, gamma=gamma, model_name=model_name, max_queue=max_queue,
                     max_batch=max_batch, layers=layers, draft_path=draft, limits=limits, tree_budget=tree_budget,
                     keep_records=keep_records)
    service = app.state.service
    shown_host = f"[{host}]" if ":" in host else host
    print(f"specledger serve: http://{shown_host}:{port}/v1  (model id {service.model_name!r})")
    print(f"speculation: drafter={service.drafter_name} gamma={service.gamma_label}  "
          f"dtype={engine.dtype}  context={engine.max_context}  batch={max_batch}  queue={max_queue}")
    print("metrics: /metrics (vLLM names: vllm:spec_decode_num_drafts_total, ...)")
    if not is_loopback(host):
        print(f"warning: bound to {host}: reachable from other machines; there is no authentication")
        if host in WILDCARD_BINDS and "*" not in hosts:
            print(f"note: only Host {', '.join(hosts)} answered; add --allow-host NAME for the names clients use")
    uvicorn.Server(uvicorn_config(app, host=host, port=port, limits=limits)).run()


def enable_access_log() -> None:
    """Send the access log (``specledger.serve.access``, INFO) to stderr, one line per request."""
    import logging
    import sys

    logger = logging.getLogger("specledger.serve.access")
    if not any(getattr(h, "_specledger_access", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        handler._specledger_access = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
