"""A measured run as the simulator's input: acceptance per prompt, request sizes and the load points.

``--from RUN_DIR`` takes any run directory with ``traces.jsonl``: every request record with rounds
(a serving sweep, ``specledger run``, the policies sweep) gives, per (prompt, drafter), one chain
pooled over its static gammas (:class:`specledger.predict.acceptance.AcceptanceModel`) and the
prompt's sizes. A serving sweep (``serving.json``) also names its load points: for each
(kind, load, setting, repeat) the records it served, so the simulator can replay the same prompts
in the same order at the same load and be compared point by point.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import require
from specledger.records import GammaSpec, RequestRecord
from specledger.rundir import SERVING_JSON, RunDir
from specledger.simulate.chains import ChainTable


@dataclass
class RunSource:
    path: Path
    records: list[RequestRecord]
    serving: dict[str, Any] | None

    @property
    def drafters(self) -> list[str]:
        return sorted({r.drafter for r in self.records if r.drafter != PLAIN.name and r.rounds})

    def serving_records(self) -> list[RequestRecord]:
        return [r for r in self.records if r.extra.get("experiment") == "serving"]

    def points(self) -> dict[tuple, list[RequestRecord]]:
        """{(kind, load, setting, repeat): records} of a serving sweep's concurrency and rate points."""
        out: dict[tuple, list[RequestRecord]] = defaultdict(list)
        for r in self.serving_records():
            if r.extra.get("kind") in ("concurrency", "rate"):
                out[(r.extra["kind"], r.extra["load"], r.extra["setting"], int(r.extra.get("repeat", 0)))].append(r)
        return dict(out)

    def prompt_order(self) -> list[str]:
        """The serving sweep's prompt ids in serving order (request i of a point serves prompt i mod n)."""
        return list((self.serving or {}).get("prompts", []))

    @classmethod
    def open(cls, path: str | Path) -> RunSource:
        """A run directory's records (:meth:`specledger.rundir.RunDir.records`) and its serving sweep's
        ``serving.json`` (None without one); a run with no decoding rounds is a one-line error."""
        run = RunDir(path)
        records = run.records()
        require(any(r.rounds for r in records), f"{run.trace_path} has no decoding rounds to take acceptance from")
        serving = run.read(SERVING_JSON, "re-run `specledger sweep --experiment serving`") \
            if run.has(SERVING_JSON) else None
        return cls(run.path, records, serving)


def acceptance_table(records: Sequence[RequestRecord], drafter: str, max_gamma: int = 16,
                     exclude_gammas: Sequence[int] = ()) -> tuple[ChainTable, dict[str, int]]:
    """The drafter's chains, one row per measured prompt, and {prompt_id: row}."""
    from specledger.predict.acceptance import AcceptanceModel

    model = AcceptanceModel.from_records(records, exclude_gammas=exclude_gammas)
    require(drafter in model.drafters(), f"the run has no static-gamma rounds of drafter {drafter!r}; "
            f"choose from {', '.join(model.drafters()) or '(none)'}")
    chains = [c for cat in model.categories() for c in model.requests(cat, drafter)]
    table = ChainTable.from_model(model, chains, max_gamma)
    return table, {c.prompt_id: i for i, c in enumerate(chains)}


def measured_gammas(records: Sequence[RequestRecord], drafter: str) -> list[int]:
    """The static gammas > 0 at which ``drafter`` has rounds in ``records``."""
    return sorted({r.gamma for r in records if r.drafter == drafter and r.rounds and isinstance(r.gamma, int)
                   and not isinstance(r.gamma, bool) and r.gamma > 0})


def tables_per_gamma(records: Sequence[RequestRecord], drafter: str, gammas: Sequence[GammaSpec],
                     max_gamma: int = 16, chains: str = "per-gamma"
                      ) -> dict[int | str, tuple[ChainTable, dict[str, int]]]:
    """One chain table per setting. ``per-gamma``: a gamma the run measured takes only the rounds
    measured at that gamma (acceptance depends on gamma: a round that follows a fully accepted one
    accepts more often, so small gammas cut more streaks and pool higher a_1); other gammas and
    policies take every static gamma pooled. ``pooled``: every setting the pooled chains."""
    require(chains in ("per-gamma", "pooled"), f"chains must be per-gamma or pooled, not {chains!r}")
    measured = measured_gammas(records, drafter)
    pooled: tuple[ChainTable, dict[str, int]] | None = None
    out: dict[int | str, tuple[ChainTable, dict[str, int]]] = {}
    for g in gammas:
        if chains == "per-gamma" and isinstance(g, int) and g in measured and len(measured) > 1:
            table, index = acceptance_table(records, drafter, max_gamma, exclude_gammas=[x for x in measured if x != g])
            table.assumption = f"chains measured at γ={g} only; " + table.assumption
            out[g] = (table, index)
        else:
            pooled = pooled or acceptance_table(records, drafter, max_gamma)
            out[g] = pooled
    return out


def plain_table(records: Sequence[RequestRecord]) -> tuple[ChainTable, dict[str, int]]:
    """Sizes per prompt for plain decoding (no acceptance needed): the mean output length of its records."""
    by: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by[r.prompt_id or r.request_id].append(r)
    ids = sorted(by)
    table = ChainTable.plain([by[i][0].prompt_tokens for i in ids],
                             [round(float(np.mean([r.output_tokens for r in by[i]]))) for i in ids],
                             [by[i][0].category for i in ids])
    return table, {pid: k for k, pid in enumerate(ids)}


def workload_order(prompt_ids: Sequence[str], rows: dict[str, int], n: int) -> np.ndarray:
    """Rows of the table for requests 0..n-1 serving ``prompt_ids`` cycled (the sweep's order)."""
    missing = [p for p in prompt_ids if p not in rows]
    require(not missing, f"no measured chain for prompt(s) {', '.join(missing[:3])}; measure them with the drafter")
    return np.array([rows[prompt_ids[i % len(prompt_ids)]] for i in range(n)], dtype=np.int64)
