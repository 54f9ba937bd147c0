"""S at a context bucket the run did not measure, from its other buckets and the cost surface (issue 48).

For a category decided per context bucket (:mod:`specledger.mainjob.buckets`), hold one bucket out entirely
(its plain and speculative records), then forecast each of its settings:

* acceptance: the category's *other* buckets' chains, pooled (what the drafter proposes and the target accepts
  is taken to carry over between lengths of the same kind of prompt);
* cost: the cost model fitted without the held-out bucket, on the run's cost surface (measured at the run's
  start over the prompts' contexts, rows 1..33), so a round and a plain step are priced at the held-out
  prompts' own contexts;
* lengths: the held-out prompts' token counts and their plain outputs' lengths (no timing, no acceptance).

Then compare with the measured end-to-end S of that bucket on the same prompts:
``|S_pred - S_measured| / S_measured``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from specledger.cost.costmodel import fit_cost_model
from specledger.engine.drafters.catalog import PLAIN
from specledger.predict.acceptance import AcceptanceModel, RequestChain
from specledger.predict.check import _pid, measured_speedup, run_max_tokens, summarize_errors, usable
from specledger.predict.predict import predict_category
from specledger.predict.replay import run_forecast_inputs
from specledger.predict.results import BucketCheckDict, BucketRowDict
from specledger.records import RequestRecord
from specledger.workloads.context_buckets import split_key


def bucketed_categories(records: Iterable[RequestRecord]) -> dict[str, list[str]]:
    """Base category -> its bucket decision keys, for categories measured in two or more buckets."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in records:
        base, bucket = split_key(r.category or "")
        if bucket is not None:
            out[base].add(r.category)
    return {base: sorted(keys) for base, keys in out.items() if len(keys) >= 2}


def _held_chains(held: str, drafter: str, plain: Sequence[RequestRecord], max_tokens: int | None
                 ) -> list[RequestChain]:
    """Chains for the held-out prompts with no counts of their own (the forecast falls back to the pooled
    acceptance of the other buckets): only their prompt and output lengths."""
    return [RequestChain(category=held, drafter=drafter, chain=[], fill=[], prompt_tokens=r.prompt_tokens,
                         output_tokens=r.output_tokens, prompt_id=_pid(r),
                         stop_reason=r.stop_reason, max_tokens=max_tokens) for r in plain]


def forecast_bucket(records: Sequence[RequestRecord], held: str, surface: Any, max_tokens: int | None = None
                    ) -> list[BucketRowDict]:
    """One row per speculative (drafter, γ) of bucket ``held``: its S forecast without any of its records, and
    the measured S on the same prompts."""
    base = split_key(held)[0]
    train = [r for r in records if r.category != held]
    test = [r for r in records if r.category == held]
    plain = {_pid(r): r for r in test if r.drafter == PLAIN.name}
    if not train or not plain:
        return []
    cost = fit_cost_model(train, source=f"fitted without {held}", n_boot=0, surface=surface)
    others = [replace(r, category=held) for r in train if split_key(r.category or "")[0] == base]
    acc = AcceptanceModel.from_records(others)
    settings = sorted({(r.drafter, r.gamma) for r in test if r.drafter != PLAIN.name and isinstance(r.gamma, int)
                       and r.gamma > 0 and not r.tree_budget})
    rows: list[BucketRowDict] = []
    for drafter, gamma in settings:
        spec = [r for r in test if r.drafter == drafter and r.gamma == gamma and _pid(r) in plain]
        if not spec or not acc.requests(held, drafter):
            continue
        base_plain = [plain[_pid(r)] for r in spec]
        pred = predict_category(cost, acc, held, drafter, gamma, chains=_held_chains(held, drafter, base_plain,
                                                                                     max_tokens), n_boot=0)
        measured = measured_speedup(spec, base_plain)
        if pred is None or not math.isfinite(measured) or measured <= 0:
            continue
        rows.append({"category": held, "drafter": drafter, "gamma": gamma, "prompts": len(spec),
                     "context": sum(r.prompt_tokens for r in base_plain) / len(base_plain),
                     "measured_speedup": measured, "predicted_speedup": pred.predicted_speedup,
                     "abs_error": abs(pred.predicted_speedup - measured) / measured})
    return rows


def leave_one_bucket_out(records: Iterable[RequestRecord], meta: dict[str, Any] | None = None) -> BucketCheckDict:
    """Every bucket of every bucketed category held out in turn (:func:`forecast_bucket`): rows, median and P90
    absolute relative error."""
    recs = usable(records)
    surface, _ = run_forecast_inputs(recs, meta)
    max_tokens = run_max_tokens(meta)
    rows = [row for keys in bucketed_categories(recs).values() for held in keys
            for row in forecast_bucket(recs, held, surface, max_tokens)]
    return {"rows": rows, **summarize_errors(rows),
            "method": "leave one context bucket out: acceptance pooled from the category's other buckets, cost from "
                      "the model fitted without it on the run's cost surface, at the held-out prompts' lengths"}
