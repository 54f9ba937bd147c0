"""The main job's prompts: the plan's initial workload items (:func:`load_items`), the race's supply of
more (:class:`PromptPool`), the prompts encoded within the prompt budget (:class:`Workload`), the jobs a
resumed run's trace already holds (:func:`done_keys`) and the verify cost surface measured at the run's
contexts (:func:`measure_run_surface`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specledger.engine.protocol import TargetEngine
from specledger.mainjob.plan import RunPlan
from specledger.records import EXPERIMENT_KEY
from specledger.rundir import RunDir


def done_keys(run: RunDir) -> set[tuple[str, str, int, float, int]]:
    """The jobs the run's trace already holds (sweep experiments share the folder, not the job list)."""
    return {
        (r.prompt_id, r.drafter, int(r.gamma), round(r.temperature, 6), int(r.tree_budget))
        for r in run.records_so_far()
        if not r.extra.get(EXPERIMENT_KEY)
    }


def load_items(plan: RunPlan, vocab_size: int):
    """The plan's initial workload items (:func:`specledger.workloads.run_items`); returns (items, warnings).
    With a budget, a workload file's items beyond ``n_per_category`` per category are left to the race
    (:class:`PromptPool`)."""
    from specledger.workloads import run_items

    items, warnings = run_items(plan.categories, plan.n_per_category, plan.seed, plan.workload_file, vocab_size)
    if plan.workload_file and plan.budget_s is not None:
        seen: dict[str, int] = {}
        first = []
        for it in items:
            seen[it.category] = seen.get(it.category, 0) + 1
            if seen[it.category] <= plan.n_per_category:
                first.append(it)
        items = first
    return items, warnings


class PromptPool:
    """The race's supply of unused prompts per category: the bundled datasets in their seeded, prefix-stable
    order (:func:`specledger.workloads.catalog.load_category`), or a workload file's remaining lines."""

    def __init__(self, plan: RunPlan, used: set[str]) -> None:
        self.plan, self.used = plan, used
        self._cache: dict[str, list[Any]] = {}
        self._asked: dict[str, int] = {}
        self._file: dict[str, list[Any]] | None = None
        if plan.workload_file:
            from specledger.workloads.jsonl import load_jsonl

            self._file = {}
            for it in load_jsonl(plan.workload_file)[0]:
                self._file.setdefault(it.category, []).append(it)

    def _bundled(self, category: str, k: int) -> list[Any]:
        """The category's items in their seeded order, loaded once and extended when a race needs more."""
        from specledger.workloads.catalog import load_category

        have = self._cache.get(category, [])
        unused = sum(it.id not in self.used for it in have)
        if unused < k and (not have or len(have) >= self._asked.get(category, 0)):
            self._asked[category] = 2 * len(have) + 64
            have = self._cache[category] = load_category(category, self._asked[category], seed=self.plan.seed)
        return have

    def more(self, category: str, k: int) -> list[Any]:
        """Up to ``k`` items of ``category`` not used yet (none for the random control)."""
        if self._file is not None:
            pool = self._file.get(category, [])
        elif category == "random":
            return []
        else:
            pool = self._bundled(category, k)
        out = [it for it in pool if it.id not in self.used][:k]
        self.used.update(it.id for it in out)
        return out



class Workload:
    """The run's prompts encoded for the target (``encoded``, ``by_id``): only those within the prompt
    budget and the context; the others are ``skipped`` with a reason."""

    def __init__(self, plan: RunPlan, engine: TargetEngine) -> None:
        self.plan, self.engine = plan, engine
        self.encoded: dict[str, list[int]] = {}
        self.by_id: dict[str, Any] = {}
        self.skipped: list[str] = []

    def register(self, new_items: Sequence[Any]) -> list[str]:
        """Encode items that fit the prompt budget into ``encoded`` / ``by_id``; returns their ids."""
        from specledger.workloads import encode_item

        plan, engine = self.plan, self.engine
        ids = []
        for it in new_items:
            tokens = encode_item(engine.loaded, it)
            if len(tokens) > plan.max_prompt_tokens or \
                    len(tokens) + plan.max_tokens_for(it.category) + max(plan.tree_budgets) > engine.max_context:
                self.skipped.append(f"{it.id}: prompt of {len(tokens)} tokens is over --max-prompt-tokens "
                                    f"{plan.max_prompt_tokens}")
                continue
            self.encoded[it.id], self.by_id[it.id] = tokens, it
            ids.append(it.id)
        return ids

    def facts(self) -> dict[str, Any]:
        """run.json ``prompts``: each prompt's category, length and token ids."""
        return {pid: {"category": it.category, "prompt_tokens": len(self.encoded[pid]),
                      "token_ids": self.encoded[pid]}
                for pid, it in self.by_id.items()}


def surface_contexts(prompt_lengths: Sequence[int], max_tokens: int, limit: int) -> list[int]:
    """Three contexts spanning the rounds of a run: the shortest prompt, the median prompt + half the
    output, the longest prompt + the whole output (within the model's context)."""
    lo, hi = min(prompt_lengths), max(prompt_lengths) + max_tokens
    mid = sorted(prompt_lengths)[len(prompt_lengths) // 2] + max_tokens // 2
    return sorted({min(c, limit) for c in (lo, mid, hi)})


#: timed passes over the run's surface: with 5, single points sat 10-15 % off their neighbours (rows 5 -> 9 rose
#: 4.0 ms at one context and 8.4 at the next, while the run's own rounds rose 7.7), which bent deep forecasts;
#: 9 passes cost about 8 s more for SmolLM2-135M on 2 cores
RUN_SURFACE_REPEATS = 9


def measure_run_surface(engine: TargetEngine, prompt_lengths: Sequence[int], max_tokens: int,
                        repeats: int = RUN_SURFACE_REPEATS) -> Any:
    """The verify cost surface this run's forecasts use: solo forwards of 1..33 rows at the run's contexts,
    interleaved and repeated (:func:`specledger.engine.calibrate.measure_rows_axis`), measured at start."""
    from specledger.engine.calibrate import ROWS_AXIS, measure_rows_axis

    limit = engine.max_context - max(ROWS_AXIS) - 1
    surface = measure_rows_axis(engine.model, surface_contexts(prompt_lengths, max_tokens, limit), repeats=repeats)
    surface.source = f"measured at the start of the run ({surface.source})"
    return surface
