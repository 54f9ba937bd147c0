"""What every side experiment of ``specledger sweep`` shares: its prompts encoded for the target
(:class:`Prompt`), one drafter per setting (:func:`drafter_factory`), its records tagged with the
experiment and setting (:func:`tag`), the refusal to measure an experiment twice into one folder
(:func:`check_fresh`), and a setting's figures against its baseline (:func:`setting_figures`: paired
S = (Σtok/Σt)_setting / (Σtok/Σt)_baseline with a bootstrap CI; :func:`identical` outputs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from specledger.engine.drafters.catalog import PLAIN, model_free_names
from specledger.engine.protocol import TargetEngine
from specledger.errors import SpecLedgerError, require
from specledger.records import EXPERIMENT_KEY, RequestRecord
from specledger.rundir import RunDir

MODEL_FREE_DRAFTERS = model_free_names()  # cheap to build; fresh instance per setting (no shared state)

Progress = Callable[[int, int, str], None]


class IdenticalDict(TypedDict):
    """How many prompts' outputs equal the reference's token for token, of those both ran."""

    identical: int
    of: int
    all_identical: bool
    differing_prompts: list[str]


class SettingFiguresDict(TypedDict):
    """One setting's figures against its baseline: tokens/s from totals, the paired speed-up over the prompts both
    ran with its bootstrap 95 % interval, and the round ledger (E[L] of full rounds, per-round means)."""

    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float
    speedup_ci: list[float | None]  # None where unbounded (a reference's own S = 1)
    el_full: float
    acceptance_rate: float
    mean_gamma: float
    mean_proposed: float
    t_round_ms: float
    rounds: int


class ExperimentHeaderDict(TypedDict):
    """The first keys of every side experiment's JSON; ``created`` local time, ISO 8601."""

    experiment: str
    created: str
    model: str
    dtype: str


class GreedyPromptFieldsDict(TypedDict):
    """What a side experiment ran: greedy (``temperature`` 0), on which prompts and categories, which skipped."""

    temperature: float
    prompts: list[str]
    categories: list[str]
    skipped_prompts: Sequence[str]


@dataclass(frozen=True)
class Prompt:
    """One workload item, encoded for the target."""

    id: str
    category: str
    ids: tuple[int, ...]
    item: Any


def encode_prompts(
    engine: TargetEngine, items: Sequence[Any], max_tokens: int, max_prompt_tokens: int = 1536
) -> tuple[list[Prompt], list[str]]:
    """Encode items with the engine's chat template; items whose prompt + ``max_tokens`` do not fit
    the context (or exceed ``max_prompt_tokens``) are skipped with a reason. Returns (prompts, skipped)."""
    from specledger.workloads import encode_item

    require(engine.loaded is not None, "the engine has no tokenizer/chat template (build it with build_engine)")
    prompts, skipped = [], []
    for it in items:
        ids = encode_item(engine.loaded, it)
        if not ids or len(ids) > max_prompt_tokens or len(ids) + max_tokens > engine.max_context:
            skipped.append(f"{it.id}: prompt of {len(ids)} tokens does not fit with {max_tokens} new tokens")
            continue
        prompts.append(Prompt(it.id, it.category, tuple(ids), it))
    require(bool(prompts), "no workload item fits the context; lower --max-tokens or pick shorter prompts")
    return prompts, skipped


def check_fresh(out_dir: Path, experiment: str) -> None:
    """Refuse to append a second copy of ``experiment`` to a run directory's traces."""
    if any(r.extra.get(EXPERIMENT_KEY) == experiment for r in RunDir(out_dir).records_so_far()):
        raise SpecLedgerError(f"{out_dir} already holds the {experiment!r} experiment; use another --out")


def drafter_factory(name: str, engine: TargetEngine, layers: str | None = None, draft_path: str | None = None
                    ) -> Callable[[], Any]:
    """A function returning the drafter for one setting. Model-free drafters get a fresh instance per
    call (the suffix tree must not learn one setting's outputs and reuse them in another); neural
    drafters hold no cross-request state and are built once (layerskip calibrates once)."""
    from specledger.engine.drafters.registry import make_drafter

    if name in MODEL_FREE_DRAFTERS or name == PLAIN.name:
        return lambda: make_drafter(name, engine)
    built = make_drafter(name, engine, layers=layers, draft_path=draft_path)
    return lambda: built


def tag(rec: RequestRecord, prompt: Prompt, experiment: str, setting: str, **extra: Any) -> RequestRecord:
    """Mark a record as belonging to a side experiment (the main analysis leaves such records out)."""
    from specledger.quality import score

    rec.category = prompt.category
    rec.prompt_id = prompt.id
    rec.extra[EXPERIMENT_KEY] = experiment
    rec.extra["setting"] = setting
    rec.extra.update(extra)
    rec.extra["quality"] = score(prompt.item, rec.text)
    return rec


def identical(spec: Sequence[RequestRecord], ref: Sequence[RequestRecord]) -> IdenticalDict:
    """Prompts whose output token ids equal the reference's (paired by prompt id)."""
    want = {r.prompt_id: r.token_ids for r in ref}
    same = [r.prompt_id for r in spec if want.get(r.prompt_id) == r.token_ids]
    differ = sorted(r.prompt_id for r in spec if r.prompt_id in want and want[r.prompt_id] != r.token_ids)
    n = len(same) + len(differ)
    return {"identical": len(same), "of": n, "all_identical": n > 0 and not differ, "differing_prompts": differ}


def setting_figures(records: Sequence[RequestRecord], baseline: Sequence[RequestRecord],
                    n_resamples: int = 1000, seed: int = 0) -> SettingFiguresDict:
    """Tokens/s from totals, the paired speed-up vs ``baseline`` with a bootstrap CI, and the round ledger:
    S = (Σtok/Σt)_setting / (Σtok/Σt)_baseline over the prompts both ran; mean γ asked per round."""
    from specledger.analysis.metrics import all_rounds, round_stats, totals
    from specledger.analysis.run import per_prompt_totals
    from specledger.analysis.scenario import shared_prompts
    from specledger.analysis.stats import paired_speedup_bootstrap

    tot = totals(records)
    st = round_stats(records)
    rounds = all_rounds(records)
    prompts = shared_prompts(records, baseline)
    point = low = high = float("nan")
    if prompts:
        point, low, high = paired_speedup_bootstrap(
            *per_prompt_totals(records, prompts), *per_prompt_totals(baseline, prompts),
            n_resamples=n_resamples, seed=seed,
        )
    return {
        "requests": tot["requests"],
        "tokens": tot["tokens"],
        "seconds": tot["total_time_s"],
        "tokens_per_s": tot["tokens_per_s"],
        "speedup": point,
        "speedup_ci": [low, high],
        "el_full": st["el_full"],
        "acceptance_rate": st["acceptance_rate"],
        "mean_gamma": float(np.mean([rd.gamma for rd in rounds])) if rounds else float("nan"),
        "mean_proposed": st["mean_proposed"],
        "t_round_ms": st["t_round_ms"],
        "rounds": st["rounds"],
    }


def quality_scores(records: Sequence[RequestRecord], prompt_ids: Sequence[str]) -> list[float | None]:
    by_id = {r.prompt_id: r.extra.get("quality") for r in records}
    return [by_id.get(p) for p in prompt_ids]


def experiment_header(experiment: str, engine: TargetEngine) -> ExperimentHeaderDict:
    """The first keys of every side experiment's JSON: which experiment, when, on which model."""
    return {"experiment": experiment, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": engine.name,
            "dtype": engine.dtype}


def greedy_prompt_fields(prompts: Sequence[Prompt], skipped: Sequence[str]) -> GreedyPromptFieldsDict:
    """The keys on what a side experiment ran: greedy (T = 0), on which prompts and categories, which skipped."""
    return {"temperature": 0.0, "prompts": [p.id for p in prompts], "categories": sorted({p.category for p in prompts}),
            "skipped_prompts": skipped}
