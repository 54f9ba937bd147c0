"""Golden outputs: a fixed tiny-model run's ``summary.json`` and traces, and a fixed set of solo and
batched requests, compared with files generated from commit 0eabce7 (before the request-state
refactor of issue #13). They pin behaviour, not speed: any change in tokens, text, rounds, stops,
chunking, event order, where time is charged, or the report's figures shows up here.

Time is made deterministic by a *virtual clock*: ``time.perf_counter`` is replaced by a clock that
advances only when the target runs a forward pass (a fixed cost plus a cost per row) or a drafter
proposes (a fixed cost plus a cost per candidate asked for). So every measured time is a pure
function of the work done, independent of how often the engine reads the clock; the costs are
dyadic fractions, so every sum and difference of times is exact in float. Under this clock the
engine's bookkeeping (sampling, verification, detokenisation, stop checks) costs nothing, hence
``t_other`` is 0: a change in what t_other *means* does not show here, a change in which forward
or proposal a time is charged to does.

Left out of the comparison, because they are not a function of the run:
  - ``generated``, ``meta.started``: wall-clock timestamps;
  - ``run_dir``, ``meta.config.workload_file``: temporary paths;
  - ``meta.machine``: the host (platform, CPU count, torch version and threads);
  - ``provenance``, ``meta.provenance``: the checkout and versions that ran (commit, dirty flag, Python, torch);
  - ``meta.cost_surface.source``: the host and time the verify surface was measured (its points are compared).
Peak memory (``ru_maxrss``) is pinned to a constant by the test. Keys absent from the golden file
may appear (other sections of the summary grow); every golden key must still be there and equal
(floats to 1e-9 relative).

Regenerate (only when a change of behaviour is intended, and say why in the commit):
``SPECLEDGER_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_summary_golden.py``.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Emitted, Engine
from specledger.engine.drafters import registry
from specledger.engine.policy import make_policy
from specledger.engine.sampling import SamplingParams
from specledger.mainjob import job as runner
from specledger.mainjob.job import RunPlan, run
from specledger.records import RequestRecord, RoundRecord
from specledger.report.build import build_report
from specledger.rundir import read_records
from tests.conftest import CharLoaded, CharTokenizer

DATA = Path(__file__).parent / "data"
REGEN = bool(os.environ.get("SPECLEDGER_REGEN_GOLDEN"))

# virtual costs (seconds, dyadic so that float sums are exact)
FORWARD_S, ROW_S = 2.0**-8, 2.0**-12
PROPOSE_S, CANDIDATE_S = 2.0**-11, 2.0**-13


class VirtualClock:
    """Stands in for ``time.perf_counter``: reads are free, only :meth:`advance` moves it."""

    def __init__(self) -> None:
        self.now = 1024.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TimedModel:
    """The target with a virtual cost per forward: FORWARD_S + ROW_S * rows."""

    def __init__(self, model: Any, clock: VirtualClock) -> None:
        self._model, self._clock = model, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, tokens, start_pos, cache, **kwargs):
        self._clock.advance(FORWARD_S + ROW_S * tokens.shape[1])
        return self._model(tokens, start_pos, cache, **kwargs)

    def forward_packed(self, tokens, slots, positions, cache, **kwargs):
        self._clock.advance(FORWARD_S + ROW_S * len(tokens))
        return self._model.forward_packed(tokens, slots, positions, cache, **kwargs)


class TimedDrafter:
    """A drafter whose ``propose`` costs PROPOSE_S + CANDIDATE_S * gamma of virtual time."""

    def __init__(self, inner: Any, clock: VirtualClock) -> None:
        self._inner, self._clock = inner, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def propose(self, context, gamma, params, rng):
        self._clock.advance(PROPOSE_S + CANDIDATE_S * gamma)
        return self._inner.propose(context, gamma, params, rng)


@pytest.fixture()
def clock(monkeypatch) -> VirtualClock:
    c = VirtualClock()
    monkeypatch.setattr(time, "perf_counter", c)
    monkeypatch.setattr(runner, "peak_rss_bytes", lambda: 123_456_789)
    return c


def _compare(golden: Any, actual: Any, path: str = "") -> None:
    """Every key of ``golden`` is in ``actual`` with an equal value (floats to 1e-9 relative)."""
    if isinstance(golden, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        for k, v in golden.items():
            assert k in actual, f"{path}/{k}: missing"
            _compare(v, actual[k], f"{path}/{k}")
    elif isinstance(golden, list):
        assert isinstance(actual, list) and len(actual) == len(golden), f"{path}: {actual!r} != {golden!r}"
        for i, (g, a) in enumerate(zip(golden, actual)):
            _compare(g, a, f"{path}[{i}]")
    elif isinstance(golden, float) and not isinstance(actual, bool) and isinstance(actual, (int, float)):
        assert math.isclose(golden, actual, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {actual!r} != {golden!r}"
    else:
        assert golden == actual, f"{path}: {actual!r} != {golden!r}"


def _check_golden(name: str, actual: Any) -> None:
    path = DATA / name
    actual = json.loads(json.dumps(actual))  # the JSON view (tuples -> lists, keys -> str)
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(actual, sort_keys=True, separators=(",", ":")) + "\n")
    _compare(json.loads(path.read_text()), actual)


# --- a fixed `specledger run` on the tiny model ------------------------------------------------------


WORKLOAD = [
    {"id": "a", "prompt": "abcabcabcabc def", "category": "copy"},
    {"id": "b", "messages": [{"role": "user", "content": "hello hello hello"}], "category": "chat"},
    {"id": "c", "prompt": "xyz xyz xyz", "category": "copy"},
    {"id": "d", "prompt": "the cat and the cat and the", "category": "chat"},
]


def _summary_view(summary: dict) -> dict:
    s = {k: v for k, v in summary.items() if k not in ("generated", "run_dir", "provenance")}
    meta = {k: v for k, v in s.get("meta", {}).items() if k not in ("started", "machine", "provenance")}
    meta["config"] = {k: v for k, v in meta.get("config", {}).items() if k != "workload_file"}
    if isinstance(meta.get("cost_surface"), dict):  # its source names the host and the time it was measured
        meta["cost_surface"] = {k: v for k, v in meta["cost_surface"].items() if k != "source"}
    s["meta"] = meta
    return s


def test_run_summary_and_traces_match_golden(tmp_path, target, clock, monkeypatch):
    made = registry.make_drafter
    monkeypatch.setattr(registry, "make_drafter", lambda *a, **k: TimedDrafter(made(*a, **k), clock))
    engine = Engine(TimedModel(target, clock), tokenizer=CharTokenizer(), eos_token_ids=[5], max_context=512,
                    name="tiny", dtype="float32")
    engine.loaded = CharLoaded()
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(x) + "\n" for x in WORKLOAD))
    plan = RunPlan(drafters=["ngram", "suffix"], gammas=[2, 4], temperatures=[0.0, 0.8], max_tokens=12,
                   workload_file=str(workload))
    out = tmp_path / "run"
    run(out, plan, engine)
    summary, _ = build_report(out, n_resamples=200)
    on_disk = json.loads((out / "summary.json").read_text())
    _check_golden("golden_run_traces.json", [asdict(r) for r in read_records(out / "traces.jsonl")])
    _check_golden("golden_run_summary.json", _summary_view(on_disk))


# --- solo streams and a batched scheduler on the same requests --------------------------------------


def _requests() -> list[BatchRequest]:
    rnd = random.Random(7)
    reqs = []
    for i in range(8):
        base = [rnd.randrange(64) for _ in range(rnd.randrange(2, 7))]
        prompt = base * rnd.randrange(1, 4) + [rnd.randrange(64) for _ in range(rnd.randrange(0, 5))]
        params = SamplingParams(temperature=0.8, seed=i) if i % 4 == 3 else SamplingParams()
        reqs.append(BatchRequest(prompt, max_tokens=rnd.randrange(4, 30), params=params, request_id=f"q{i}",
                                 stop=["eIxi", "@@"] if i % 3 == 0 else (["c8", "Qh"] if i % 3 == 1 else []),
                                 ignore_eos=i % 2 == 1))
    return reqs


SETTINGS = [("none", 0), ("ngram", 3), ("suffix", 2), ("ngram", "heuristic"), ("suffix", "ema")]


def _policy(gamma: int | str) -> Any:
    return gamma if isinstance(gamma, int) else make_policy(gamma)  # a fresh policy per request


def _event_view(ev: Any) -> Any:
    if isinstance(ev, Emitted):
        return ["emitted", ev.token_ids, ev.text, ev.t]
    if isinstance(ev, RoundRecord):
        return ["round", asdict(ev)]
    assert isinstance(ev, RequestRecord)
    return ["record", asdict(ev)]


def test_solo_and_batched_events_match_golden(target, char_tokenizer, clock):
    from specledger.engine.drafters.registry import make_drafter

    model = TimedModel(target, clock)
    views: dict[str, Any] = {}
    for drafter, gamma in SETTINGS:
        solo = Engine(model, char_tokenizer, eos_token_ids=[5], max_context=256, name="tiny")
        for r in _requests():
            d = TimedDrafter(make_drafter(drafter, solo), clock)
            evs = solo.stream(r.prompt, drafter=d, gamma=_policy(gamma), params=r.params, max_tokens=r.max_tokens,
                              stop=r.stop, request_id=r.request_id, ignore_eos=r.ignore_eos)
            views[f"solo|{drafter}|{gamma}|{r.request_id}"] = [_event_view(e) for e in evs]
        for budget in (None, 60):  # 60: KV budget small enough to preempt and recompute
            engine = BatchEngine(model, char_tokenizer, eos_token_ids=[5], max_batch=3, capacity=128,
                                 kv_budget_tokens=budget, name="tiny")
            sched = engine.scheduler(stream_text=True)
            reqs = _requests()
            tickets = {sched.add(r, TimedDrafter(make_drafter(drafter, solo), clock), _policy(gamma)): r.request_id
                       for r in reqs[:5]}
            events: list[Any] = []
            pending = reqs[5:]
            while len(sched) or pending:
                if pending and len(events) % 2 == 0:
                    r = pending.pop(0)
                    tickets[sched.add(r, TimedDrafter(make_drafter(drafter, solo), clock),
                                      _policy(gamma))] = r.request_id
                events.append([[tickets[t], _event_view(e)] for t, e in sched.step()])
            views[f"batch|{drafter}|{gamma}|{budget}"] = {
                "events": events,
                "steps": [asdict(s) for s in engine.steps],
                "preemptions": engine.preemptions,
                "peak_reserved_tokens": engine.peak_reserved_tokens,
            }
    _check_golden("golden_engine_events.json", views)
