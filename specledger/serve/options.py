"""The work behind ``specledger serve`` (the command: :mod:`specledger.cli.serve`): option checks before the model
load, the Host names answered, the access log, and the engine and app built from the options."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, TypeVar

from specledger.errors import SpecLedgerError

T = TypeVar("T")

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
    from specledger.engine.drafters.catalog import by_name
    from specledger.serve.app import parse_gamma

    if not 0 <= port <= 65535:
        raise SpecLedgerError(f"--port must be in 0..65535, got {port}")
    by_name(drafter)
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


def build_app(target: str | None, dtype: str, device: str, *, drafter: str, gamma: str, model_name: str | None,
              max_queue: int, max_batch: int, layers: str | None, draft: str | None, limits: Any, tree_budget: int,
              keep_records: int) -> tuple[Any, Any]:
    """The engine (loaded now) and the served app over it; ``build_engine`` and ``create_app`` are looked up at call
    time (tests swap them)."""
    from specledger.engine.build import build_engine
    from specledger.serve.app import create_app

    def build() -> tuple[Any, Any]:
        engine = build_engine(target, dtype) if device == "cpu" else build_engine(target, dtype, device)
        app = create_app(engine, drafter_name=drafter, gamma=gamma, model_name=model_name, max_queue=max_queue,
                         max_batch=max_batch, layers=layers, draft_path=draft, limits=limits,
                         tree_budget=tree_budget, keep_records=keep_records)
        return engine, app

    return off_main_thread(build)


def off_main_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run on a thread of its own (its exception re-raised here), so that the main thread -- the event
    loop's -- never starts an OpenMP team. The engine decodes on its worker thread; once the main thread has run a
    parallel region (loading the model does), libgomp keeps that team's idle thread, counts more threads than the
    2 CPUs, and the worker's two kernel threads then decode no faster than one: 13.0 ms a step against 8.5 ms
    (benchmarks/diag_thread_step.py). Loaded off the main thread, the worker's step equals the main thread's."""
    import threading

    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller as it is
            failure.append(exc)

    loader = threading.Thread(target=run, name="specledger-load")
    loader.start()
    loader.join()
    if failure:
        raise failure[0]
    return result[0]


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
