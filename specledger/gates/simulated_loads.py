"""The simulated loads of a run's summary (``specledger run --simulate-loads 64,256``).

From the run's records alone (so ``specledger report`` rebuilds the same figures; the simulation is
seeded): the solo chains and sizes (:mod:`specledger.simulate.run_loads`), priced by the run's own
measured cost model on its cost surface -- :func:`specledger.cost.costmodel.fit_cost_model` on the
solo rounds with the surface measured at the run's start, what ``cost_model.json`` holds and
``specledger simulate --from RUN`` reads. Each setting is simulated at every simulated load (the
run's prompts, categories interleaved, cycled to max(L, prompts) requests) and, to validate, at every
measured load > 1 with that point's own request order; the gates and verdicts at the simulated loads
come from :mod:`specledger.gates.simulated`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import SpecLedgerError
from specledger.gates import SLO
from specledger.gates.candidates import Candidate, Gates
from specledger.gates.decision import SimulationErrorDict, VerdictDict
from specledger.gates.simulated import error_note, plain_latency, simulated_scenarios, simulated_verdicts
from specledger.load_points import interleaved, requests_at
from specledger.records import EXPERIMENT_KEY, RequestRecord, load_records

#: requests behind every simulated point (a point of n requests is simulated ceil(256 / n) times) ...
MIN_REQUESTS = 256
#: ... unless the run has so many points that this budget is reached first (then fewer repeats, at least one)
BUDGET_REQUESTS = 4000


class SimulationDoc(TypedDict, total=False):
    """``summary.json`` ``simulation``: what was simulated, priced by what, and how well it was validated."""

    loads: list[int]  # the simulated loads
    min_requests: int  # requests behind every simulated point
    note: str  # why nothing was simulated (only then)
    cost_source: str  # the cost model that priced the simulation
    validation: list[dict[str, Any]]  # simulator vs measured per measured point (simulate.run_loads.validation)
    errors: dict[str, SimulationErrorDict]  # per temperature (as text): the largest errors found
    requests: int  # simulated requests in all
    seconds: float  # wall time the simulation took, s


class SimulatedLoads(TypedDict):
    """The simulated loads of a run (:func:`simulated_loads`)."""

    verdicts: list[VerdictDict]  # each with ``load``, ``simulated: true`` and ``simulation_error``
    scenarios: list[Candidate]  # every setting at every simulated load, with its gates
    simulation: SimulationDoc


def _index(r: RequestRecord) -> int:
    """Request i of a load point (its id ends in ``|i``, :mod:`specledger.mainjob.measured_loads`)."""
    tail = r.request_id.rsplit("|", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def measured_points(records: Sequence[RequestRecord]) -> dict[tuple[float, int, str], list[RequestRecord]]:
    """The load points' records per (temperature, load, setting), each in request order."""
    out: dict[tuple[float, int, str], list[RequestRecord]] = defaultdict(list)
    for r in load_records(records):
        out[(float(r.temperature), int(r.extra["load"]), str(r.extra.get("setting")))].append(r)
    return {k: sorted(v, key=_index) for k, v in out.items()}


def solo_chains(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The main job's solo chain records (one request at a time, static γ): what the simulator replays."""
    return [r for r in records if not r.extra.get(EXPERIMENT_KEY) and not r.tree_budget
            and isinstance(r.gamma, int) and all(rd.batch_size <= 1 for rd in r.rounds)]


def point_orders(solo: Sequence[RequestRecord], measured: dict[tuple[float, int, str], list[RequestRecord]],
                 sim_loads: Sequence[int]) -> dict[tuple[float, int], list[str]]:
    """Requests (prompt ids in order) of every point to simulate: each measured load > 1 in its plain point's
    own order (to validate), each simulated load as a measured point would be (categories interleaved,
    cycled to max(L, prompts))."""
    orders = {(t, load): [r.prompt_id for r in recs] for (t, load, setting), recs in measured.items()
              if setting == "plain"}
    for t in sorted({float(r.temperature) for r in solo}):
        plain = [r for r in solo if r.drafter == PLAIN.name and float(r.temperature) == t]
        ids = list(dict.fromkeys(r.prompt_id for r in plain))
        base = interleaved(ids, {r.prompt_id: r.category for r in plain})
        for load in sim_loads:
            orders[(t, int(load))] = requests_at(int(load), base)
    return orders


def run_pricer(solo: Sequence[RequestRecord], surface: Any) -> Any:
    """The run's measured cost model on its cost surface (``cost_model.json``'s fit, without its bootstrap)."""
    from specledger.cost.costmodel import fit_cost_model
    from specledger.predict.check import usable

    return fit_cost_model(usable(solo), source="the run's solo rounds on its measured cost surface "
                          "(cost_model.json)" if surface is not None else "the run's solo rounds (cost_model.json)",
                          n_boot=0, surface=surface)


def _history(scenarios: Sequence[Candidate]) -> dict[tuple, list[tuple[int, Gates]]]:
    """(category, temperature, drafter, γ) -> [(load, gates)] of the measured scenarios."""
    out: dict[tuple, list[tuple[int, Gates]]] = defaultdict(list)
    for s in scenarios:
        if not s.get("simulated") and s.get("gates"):
            out[(s["category"], float(s["temperature"]), s["drafter"], s["gamma"])].append((int(s.get("load") or 1),
                                                                                          s["gates"]))
    return out


def simulated_loads(records: Sequence[RequestRecord], meta: dict[str, Any], slo: SLO, sim_loads: Sequence[int],
                    measured_scenarios: Sequence[Candidate], controls: Mapping[tuple[str, float], float] | None,
                    surface: Any, n_resamples: int = 1000, seed: int = 0) -> SimulatedLoads:
    """``{"verdicts", "scenarios", "simulation"}`` of the simulated loads (see the module docstring);
    ``measured_scenarios``: every measured scenario with its gates (load 1 and the load points)."""
    from specledger.simulate.run_loads import settings_of, simulate_points, validation, worst_errors

    start = time.perf_counter()
    solo = solo_chains(records)
    doc: SimulationDoc = {"loads": sorted(set(sim_loads)), "min_requests": MIN_REQUESTS}
    if not any(r.rounds for r in solo if r.drafter != PLAIN.name):
        return {"verdicts": [], "scenarios": [], "simulation": {**doc, "note": "not simulated: the run has no solo "
                                                                               "speculative rounds to replay"}}
    try:
        cost = run_pricer([r for r in records if not r.extra.get(EXPERIMENT_KEY)], surface)
    except SpecLedgerError as exc:
        return {"verdicts": [], "scenarios": [], "simulation": {**doc, "note": f"not simulated: {exc}"}}
    measured = measured_points(records)
    orders = point_orders(solo, measured, sim_loads)
    n_points = sum(len(settings_of([r for r in solo if float(r.temperature) == t])) for t, _ in orders)
    per_point = max(1, min(MIN_REQUESTS, BUDGET_REQUESTS // max(n_points, 1)))
    points = simulate_points(solo, orders, cost, per_point)
    rows = validation(points, measured)
    categories = {r.prompt_id: r.category for r in solo}
    history = _history(measured_scenarios)
    scenarios: list[Candidate] = []
    decided: list[VerdictDict] = []
    notes: dict[str, SimulationErrorDict] = {}
    for t in sorted({p.temperature for p in points}):
        at = [p for p in points if p.temperature == t and p.load in set(sim_loads)]
        errors = worst_errors(rows, t)
        validated = sorted({row["load"] for row in rows if row["temperature"] == t})
        note = error_note(errors, validated)
        notes[str(t)] = note.to_dict()
        mine = simulated_scenarios(at, categories, solo, history, meta, slo, errors.get("speedup") if validated
                                   else None, n_resamples, seed)
        scenarios += mine
        decided += simulated_verdicts(mine, slo, controls, note, plain_latency(at, categories, slo))
    doc.update(min_requests=per_point, cost_source=cost.source, validation=rows, errors=notes,
               requests=int(sum(p.tokens.size for p in points)), seconds=time.perf_counter() - start)
    return {"verdicts": decided, "scenarios": scenarios, "simulation": doc}


__all__ = ["measured_points", "point_orders", "run_pricer", "simulated_loads", "solo_chains"]
