"""``serve`` loads its engine off the main thread (serve/options.py:off_main_thread): the event loop's thread must
never start an OpenMP team, or the worker's two kernel threads decode no faster than one."""

from __future__ import annotations

import threading

import pytest

from specledger.errors import SpecLedgerError
from specledger.serve.options import off_main_thread


def test_runs_on_another_thread_and_returns_its_result() -> None:
    seen = off_main_thread(lambda: threading.current_thread())
    assert seen is not threading.current_thread() and seen.name == "specledger-load"
    assert off_main_thread(lambda: (1, "app")) == (1, "app")


def test_a_failure_reaches_the_caller_as_it_was() -> None:
    def fail() -> None:
        raise SpecLedgerError("model not found: x.gguf")

    with pytest.raises(SpecLedgerError, match="model not found"):
        off_main_thread(fail)


def test_build_app_loads_the_engine_off_the_main_thread(monkeypatch) -> None:
    import specledger.engine.build as engine_build
    import specledger.serve.app as serve_app
    from specledger.serve.options import build_app

    threads: list[threading.Thread] = []

    def fake_engine(target=None, dtype="auto"):
        threads.append(threading.current_thread())
        return "engine"

    monkeypatch.setattr(engine_build, "build_engine", fake_engine)
    monkeypatch.setattr(serve_app, "create_app", lambda engine, **kw: f"app over {engine}")
    assert build_app(None, "auto", "cpu", drafter="none", gamma="0", model_name=None, max_queue=1, max_batch=1,
                     layers=None, draft=None, limits=None, tree_budget=0, keep_records=0) == ("engine",
                                                                                              "app over engine")
    assert threads and threads[0] is not threading.main_thread()
