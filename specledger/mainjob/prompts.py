"""The main job's prompts: the plan's initial workload items (:func:`load_items`), the race's supply of
more (:class:`PromptPool`), the prompts encoded within the prompt budget (:class:`Workload`), the jobs a
resumed run's trace already holds (:func:`done_keys`) and the verify cost surface measured at the run's
contexts (:func:`measure_run_surface`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

from specledger.engine.protocol import TargetEngine
from specledger.mainjob.buckets import BUCKETED_BUILTIN, CANDIDATES, bucketed_item, nearest, split_initial
from specledger.mainjob.plan import RunPlan
from specledger.records import EXPERIMENT_KEY
from specledger.rundir import RunDir
from specledger.workloads.context_buckets import bucket_key, bucket_of, split_key
from specledger.workloads.item import WorkloadItem

if TYPE_CHECKING:
    from specledger.cost.surface import CostSurface


class PromptFacts(TypedDict):
    """One prompt as ``run.json``'s ``prompts`` keeps it (``summary.json`` drops its ``token_ids``)."""

    category: str  # its decision key: the category, or "category@bucket" where the category is split by context
    prompt_tokens: int  # its length in the target's tokens
    token_ids: list[int]  # the prompt as the target saw it (what the forecasts replay)


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


def traffic_counts(plan: RunPlan, file: dict[str, list[WorkloadItem]] | None = None,
                   key_of: Callable[[WorkloadItem], str] | None = None) -> dict[str, int]:
    """Requests per category of the workload, the mix's default shares (:func:`specledger.gates.mix.mix_weights`):
    a workload file's lines per category (``file``: :func:`file_items`, read here when not given; ``key_of``: a
    line's decision key, its context bucket's where its category is split), else ``n_per_category`` for every
    built-in category."""
    file = file if file is not None else file_items(plan)
    if file is None:
        return {c: plan.n_per_category for c in plan.categories}
    counts: dict[str, int] = {}
    for c, items in file.items():
        for it in items:
            key = key_of(it) if key_of is not None else c
            counts[key] = counts.get(key, 0) + 1
    return counts


class PromptPool:
    """The race's supply of unused prompts per category: the bundled datasets in their seeded, prefix-stable
    order (:func:`specledger.workloads.catalog.load_category`), or a workload file's remaining lines. A context
    bucket's decision key (``"long@2-4k"``) draws its category's prompts that fall in that bucket (``bucket_of``:
    a prompt's bucket, None when it does not fit)."""

    def __init__(self, plan: RunPlan, used: set[str], bucket_of: Callable[[WorkloadItem], str | None] | None = None,
                 file: dict[str, list[WorkloadItem]] | None = None) -> None:
        self.plan, self.used, self.bucket_of = plan, used, bucket_of
        self._cache: dict[str, list[WorkloadItem]] = {}
        self._asked: dict[str, int] = {}
        self._file = file if file is not None else file_items(plan)

    def _bundled(self, category: str, k: int, wanted: Callable[[WorkloadItem], bool]) -> list[WorkloadItem]:
        """The category's items in their seeded order, loaded once and extended while fewer than ``k`` unused ones
        are ``wanted`` and the source has more."""
        from specledger.workloads.catalog import load_category

        have = self._cache.get(category, [])
        while sum(it.id not in self.used and wanted(it) for it in have) < k and \
                (not have or len(have) >= self._asked.get(category, 0)):
            self._asked[category] = 2 * len(have) + 64
            have = self._cache[category] = load_category(category, self._asked[category], seed=self.plan.seed)
        return have

    def more(self, category: str, k: int) -> list[WorkloadItem]:
        """Up to ``k`` items of ``category`` (or of its bucket) not used yet (none for the random control)."""
        base, bucket = split_key(category)

        def wanted(it: WorkloadItem) -> bool:
            return bucket is None or self.bucket_of is None or self.bucket_of(it) == bucket

        if self._file is not None:
            pool = self._file.get(base, [])
        elif base == "random":
            return []
        else:
            pool = self._bundled(base, k, wanted)
        out = [it for it in pool if it.id not in self.used and wanted(it)][:k]
        self.used.update(it.id for it in out)
        return out


def file_items(plan: RunPlan) -> dict[str, list[WorkloadItem]] | None:
    """A workload file's items per category, in file order (None without a file)."""
    if not plan.workload_file:
        return None
    from specledger.workloads.jsonl import load_jsonl

    out: dict[str, list[WorkloadItem]] = {}
    for it in load_jsonl(plan.workload_file)[0]:
        out.setdefault(it.category, []).append(it)
    return out


def context_candidates(plan: RunPlan, file: dict[str, list[WorkloadItem]] | None = None
                       ) -> dict[str, list[WorkloadItem]]:
    """Per text category, the prompts whose lengths decide whether it is split by context bucket: a workload file's
    lines, or the first :data:`~specledger.mainjob.buckets.CANDIDATES` of a built-in category's order (only those
    of :data:`~specledger.mainjob.buckets.BUCKETED_BUILTIN`: the others' prompts are short by design)."""
    if not plan.context_buckets:
        return {}
    if (file := file if file is not None else file_items(plan)) is not None:
        return file
    from specledger.workloads.catalog import load_category

    return {c: load_category(c, CANDIDATES, seed=plan.seed) for c in plan.categories if c in BUCKETED_BUILTIN}


class Workload:
    """The run's prompts encoded for the target (``encoded``, ``by_id``): only those within the prompt
    budget and the context; the others are ``skipped`` with a reason."""

    def __init__(self, plan: RunPlan, engine: TargetEngine) -> None:
        self.plan, self.engine = plan, engine
        self.encoded: dict[str, list[int]] = {}
        self.by_id: dict[str, WorkloadItem] = {}
        self.skipped: list[str] = []
        #: the workload file's items per category, read once for the run (None without a file)
        self.file = file_items(plan)
        #: categories decided per context bucket, and their buckets (:mod:`specledger.mainjob.buckets`)
        self.bucketed: dict[str, list[str]] = {}
        self._ids: dict[str, list[int]] = {}  # item id -> its prompt's token ids, encoded once

    def _tokens(self, item: WorkloadItem) -> list[int]:
        from specledger.workloads import encode_item

        if item.id not in self._ids:
            self._ids[item.id] = encode_item(self.engine.loaded, item)
        return self._ids[item.id]

    def fits(self, item: WorkloadItem, length: int) -> bool:
        """Whether a prompt of ``length`` tokens fits the prompt budget and the context with its output."""
        plan = self.plan
        return length <= plan.max_prompt_tokens_for(item.category) and \
            length + plan.max_tokens_for(item.category) + max(plan.tree_budgets) <= self.engine.max_context

    def why_not(self, item: WorkloadItem, length: int) -> str:
        """Why a prompt of ``length`` tokens is skipped (it does not :meth:`fits`)."""
        cap, out = self.plan.max_prompt_tokens_for(item.category), self.plan.max_tokens_for(item.category)
        if length > cap:
            return f"{item.id}: prompt of {length} tokens is over the prompt budget of {cap} tokens"
        return (f"{item.id}: prompt of {length} tokens + {out} output tokens does not fit the model's "
                f"{self.engine.max_context}-token context")

    def length(self, item: WorkloadItem) -> int | None:
        """The prompt's token count, None when it does not fit (:meth:`fits`)."""
        n = len(self._tokens(item))
        return n if self.fits(item, n) else None

    def decision_key(self, item: WorkloadItem) -> str:
        """The category ``item`` is decided in: its context bucket's key where its category is split (a bucket
        with too few prompts joins the nearest decided one), else its own."""
        category = split_key(item.category)[0]
        bucket = self.bucket(item) if category in self.bucketed else None
        return item.category if bucket is None else bucket_key(category, nearest(bucket, self.bucketed[category]))

    def bucket(self, item: WorkloadItem) -> str | None:
        """The context bucket of a prompt that fits, else None."""
        n = self.length(item)
        return None if n is None else bucket_of(n)

    def split_by_context(self, items: Sequence[WorkloadItem], candidates: dict[str, Sequence[WorkloadItem]]
                         ) -> list[WorkloadItem]:
        """The initial items with the categories that span context buckets split into them
        (:func:`specledger.mainjob.buckets.split_initial`); remembers which, for the race's prompts."""
        keep_all = bool(self.plan.workload_file) and self.plan.budget_s is None  # a file without a budget: every line
        items, self.bucketed = split_initial(items, candidates, self.length, self.plan.n_per_category, keep_all)
        return items

    def register(self, new_items: Sequence[WorkloadItem]) -> list[str]:
        """Encode items that fit the prompt budget into ``encoded`` / ``by_id``; returns their ids."""
        ids = []
        for it in new_items:
            tokens = self._tokens(it)
            if not self.fits(it, len(tokens)):
                self.skipped.append(self.why_not(it, len(tokens)))
                continue
            if (key := self.decision_key(it)) != it.category:
                it = bucketed_item(it, split_key(key)[1])
            self.encoded[it.id], self.by_id[it.id] = tokens, it
            ids.append(it.id)
        return ids

    def facts(self) -> dict[str, PromptFacts]:
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
                        repeats: int = RUN_SURFACE_REPEATS) -> CostSurface:
    """The verify cost surface this run's forecasts use: solo forwards of 1..33 rows at the run's contexts,
    interleaved and repeated (:func:`specledger.engine.calibrate.measure_rows_axis`), measured at start."""
    from specledger.engine.calibrate import ROWS_AXIS, measure_rows_axis

    limit = engine.max_context - max(ROWS_AXIS) - 1
    surface = measure_rows_axis(engine.model, surface_contexts(prompt_lengths, max_tokens, limit), repeats=repeats)
    surface.source = f"measured at the start of the run ({surface.source})"
    return surface
