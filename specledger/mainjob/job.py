"""The main job: plain decoding and every drafter over real workloads, across gamma and temperature.

A run directory holds ``run.json`` (what was planned, on which model and machine),
``traces.jsonl`` (one RequestRecord per finished request, appended and fsync'ed as each
prompt's requests end) and, at the end, ``summary.json`` + ``report.html``. A job is identified by
(prompt id, drafter, gamma, temperature, tree budget); ``resume`` skips jobs already in the trace, so an
interrupted run loses at most the prompt that was in flight.

Fairness on a noisy machine: for each prompt (and temperature) the plain baseline and every speculative
setting run side by side, one round of each in turn (:mod:`specledger.engine.interleave`: each request
solo, with its own KV cache and a clock that stops while the others run), so the machine's drift hits
all settings alike and cancels in their speed-ups. ``RunPlan.interleave_rounds = False`` runs them one
after the other instead.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from warnings import warn

from specledger.engine.protocol import TargetEngine
from specledger.errors import SpecLedgerError, SpecLedgerWarning, require
from specledger.records import EXPERIMENT_KEY
from specledger.rundir import SURFACE_KEY, RunDir

DEFAULT_CATEGORIES = ("code", "code-edit", "extraction", "agent", "dialogue", "summary", "math", "random")
#: drafters of ``make run`` (the default preset): the model-free ones, which pay on this CPU. layerskip (S about
#: 0.5 here: a draft pass costs most of a verify pass) is dropped by every race at its first look, so it only
#: cost the budget; --drafters ngram,suffix,layerskip or --full runs it (--full adds quant-self too)
DEFAULT_DRAFTERS = ("ngram", "suffix")
#: concurrencies of the presets (1 = the solo job); chosen so that ``make run`` fits 10 minutes on 2 cores
#: (estimated: load 16 adds about 2 minutes to the default run, load 4 about 2.5 more: ``--loads 1,4,16``)
DEFAULT_LOADS = (1, 16)
QUICK_LOADS = (1, 16)
FULL_LOADS = (1, 2, 4, 8, 16, 32)
#: simulated after every preset's measured part (:mod:`specledger.simulated_loads`): about a second on 2 cores
SIMULATED_LOADS = (64,)
#: ``make run``'s time budget (seconds, from the start of ``specledger run`` to its report): with set-up on a
#: fresh clone it fits 8 minutes on 2 cores; racing spends what the initial prompts leave
DEFAULT_BUDGET_S = 360.0
#: ``--quick``'s budget
QUICK_BUDGET_S = 150.0
#: prompts per category before racing: 2, the least that gives an interval (Student's t with 1 degree of
#: freedom, 6.3 at α = 0.05, so only large differences -- a drafter at half plain's speed -- resolve there);
#: the race adds prompts only where decisions stay open
DEFAULT_INITIAL_PROMPTS = 2
#: kept back from the budget for the summary, the report and the simulated loads after the race
REPORT_RESERVE_S = 30.0
#: output budgets where the task metric needs room: HumanEval a whole function, ASDiv a stated answer
QUALITY_MAX_TOKENS = {"code": 96, "math": 64}


@dataclass
class RunPlan:
    """What to run. Presets: :func:`preset` ("quick" ~1 min, "default" ~5 min, "full" hours on 2 cores)."""

    categories: list[str] = field(default_factory=lambda: list(DEFAULT_CATEGORIES))
    n_per_category: int = 2
    drafters: list[str] = field(default_factory=lambda: ["ngram", "suffix", "layerskip", "quant-self"])
    gammas: list[int] = field(default_factory=lambda: [2, 4])
    #: gammas for drafters that run a network (layerskip, quant-self, model, head); None = ``gammas``.
    #: Their rounds cost a draft pass per candidate, so the default run samples fewer of them.
    model_gammas: list[int] | None = field(default_factory=lambda: [2])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    #: token-tree node budgets per round for every drafter x gamma (0 = a chain; a tree's depth <= gamma)
    tree_budgets: list[int] = field(default_factory=lambda: [0])
    #: which tree a tree round proposes: dynamic (EAGLE-2 best-first) or the DP's static shape
    #: (dp, dp:p1,p2,.., dp:RUN_DIR; :mod:`specledger.predict.tree_shape_spec`)
    tree_shape: str = "dynamic"
    max_tokens: int = 40
    max_prompt_tokens: int = 1536
    seed: int = 0
    layers: str | None = None  # layerskip layers; None = calibrate
    draft: str | None = None  # draft model path for the "model" drafter
    workload_file: str | None = None
    #: also run ``specledger sweep``'s experiments (quant4, policies, serving) into the run directory
    side_experiments: bool = False
    #: concurrencies: 1 is the solo job above; every load > 1 runs each setting under continuous
    #: batching, closed loop over the same prompts (:mod:`specledger.mainjob.loads`)
    loads: list[int] = field(default_factory=lambda: [1])
    #: loads beyond the measured ones, simulated from this run after it (:mod:`specledger.simulated_loads`);
    #: their verdicts are labelled simulated
    simulate_loads: list[int] = field(default_factory=list)
    #: output budget per category where the task metric needs room (a whole function, an answer);
    #: other categories get ``max_tokens``
    category_max_tokens: dict[str, int] = field(default_factory=dict)
    #: a prompt's settings run side by side, one round of each in turn (see the module doc); False: one
    #: request after the other
    interleave_rounds: bool = True
    #: the run's time budget in seconds (None: no racing, every prompt of the plan and nothing more). With a
    #: budget, after the initial prompts the job races (:mod:`specledger.mainjob.race`): more prompts where
    #: decisions are open, losing settings dropped, until all are resolved or the budget is spent; a
    #: workload file's lines beyond ``n_per_category`` per category are the race's pool
    budget_s: float | None = None
    #: prompts added per open category and race round
    race_step: int = 2

    def max_tokens_for(self, category: str) -> int:
        return int(self.category_max_tokens.get(category, self.max_tokens))

    def gammas_for(self, drafter: str) -> list[int]:
        neural = drafter in ("layerskip", "quant-self", "model", "head")
        return self.model_gammas if neural and self.model_gammas is not None else self.gammas

    def validate(self) -> None:
        require(self.n_per_category >= 1, "--n must be >= 1")
        require(all(g >= 1 for g in self.gammas + (self.model_gammas or [])),
                "gammas must be >= 1 (plain decoding is always run as the baseline)")
        require(all(t >= 0 for t in self.temperatures), "temperatures must be >= 0")
        require(bool(self.tree_budgets) and all(isinstance(b, int) and b >= 0 for b in self.tree_budgets),
                "--tree-budgets must be integers >= 1 (0 = chain), e.g. 0,8,16")
        require(len(set(self.tree_budgets)) == len(self.tree_budgets), "--tree-budgets must be distinct")
        from specledger.predict.tree_shape_spec import check_tree_shape

        check_tree_shape(self.tree_shape)
        require(self.max_tokens >= 1, "--max-tokens must be >= 1")
        require(self.budget_s is None or (isinstance(self.budget_s, (int, float)) and self.budget_s > 0
                                          and math.isfinite(self.budget_s)),
                f"--budget must be a positive time such as 300, 90s or 6m (got {self.budget_s})")
        require(isinstance(self.race_step, int) and self.race_step >= 1, "race_step must be a whole number >= 1")
        require(bool(self.loads) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                         for x in self.loads),
                f"--loads must be whole numbers of concurrent requests >= 1, e.g. 1,4,16 (got {self.loads})")
        require(all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in self.simulate_loads),
                f"--simulate-loads must be whole numbers of concurrent requests >= 1, e.g. 64,256 "
                f"(got {self.simulate_loads})")
        both = sorted(set(self.simulate_loads) & {1, *self.loads})
        require(not both, f"--simulate-loads {','.join(map(str, both))} is measured too (--loads "
                f"{','.join(map(str, sorted({1, *self.loads})))}); simulate only loads that are not measured")
        require(all(isinstance(v, int) and v >= 1 for v in self.category_max_tokens.values()),
                "category max_tokens must be whole numbers >= 1")
        from specledger.engine.drafters.registry import DRAFTERS

        for d in self.drafters:
            require(d in DRAFTERS and d != "none", f"unknown drafter {d!r}; choose from {', '.join(DRAFTERS[1:])}")
        require("model" not in self.drafters or self.draft, "the 'model' drafter needs --draft PATH")


def preset(name: str) -> RunPlan:
    if name == "quick":  # two prompts per category: the least that gives a bootstrap CI, hence a verdict
        return RunPlan(categories=["code-edit", "dialogue", "math"], n_per_category=2,
                       drafters=["ngram", "suffix", "layerskip"], gammas=[4], max_tokens=40,
                       loads=list(QUICK_LOADS), category_max_tokens=dict(QUALITY_MAX_TOKENS),
                       simulate_loads=list(SIMULATED_LOADS), budget_s=QUICK_BUDGET_S)
    if name == "default":  # quant-self (S ~0.5 on this CPU, a third of the run's time) is left to --full
        return RunPlan(n_per_category=DEFAULT_INITIAL_PROMPTS, drafters=list(DEFAULT_DRAFTERS),
                       loads=list(DEFAULT_LOADS), category_max_tokens=dict(QUALITY_MAX_TOKENS),
                       simulate_loads=list(SIMULATED_LOADS), budget_s=DEFAULT_BUDGET_S)
    if name == "full":
        return RunPlan(n_per_category=8, gammas=[1, 2, 3, 4, 6, 8], model_gammas=None, temperatures=[0.0, 0.8],
                       max_tokens=256, max_prompt_tokens=6144, side_experiments=True, loads=list(FULL_LOADS),
                       simulate_loads=list(SIMULATED_LOADS))
    raise SpecLedgerError(f"unknown preset {name!r}; use quick, default or full")


@dataclass(frozen=True)
class Job:
    prompt_id: str
    drafter: str
    gamma: int
    temperature: float
    tree_budget: int = 0

    @property
    def key(self) -> tuple[str, str, int, float, int]:
        return (self.prompt_id, self.drafter, self.gamma, round(self.temperature, 6), self.tree_budget)


def plan_jobs(prompt_ids: Sequence[str], plan: RunPlan) -> list[Job]:
    """Per prompt and temperature: the plain baseline, then every drafter x gamma (interleaved)."""
    jobs = []
    for t in plan.temperatures:
        for pid in prompt_ids:
            jobs.append(Job(pid, "none", 0, t))
            for d in plan.drafters:
                for g in plan.gammas_for(d):
                    for b in plan.tree_budgets:
                        jobs.append(Job(pid, d, g, t, b))
    return jobs


#: requests side by side at most: each holds a KV cache of its own (--full runs 25 settings per prompt, up to
#: 8k positions: 25 caches would take ~9 GB for SmolLM2-135M; 8 take ~3 GB)
MAX_SIDE_BY_SIDE = 8


def job_groups(jobs: Sequence[Job], interleave: bool = True, width: int = MAX_SIDE_BY_SIDE) -> list[list[Job]]:
    """The jobs that run side by side (:func:`specledger.engine.interleave.run_interleaved`): consecutive jobs
    of one prompt and temperature, at most ``width`` of them; each job alone when ``interleave`` is off."""
    if not interleave:
        return [[j] for j in jobs]
    groups: list[list[Job]] = []
    for j in jobs:
        if groups and len(groups[-1]) < width and \
                (groups[-1][0].prompt_id, groups[-1][0].temperature) == (j.prompt_id, j.temperature):
            groups[-1].append(j)
        else:
            groups.append([j])
    return groups


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
    interleaved and repeated (:func:`specledger.predict.calibrate.measure_rows_axis`), measured at start."""
    from specledger.predict.calibrate import ROWS_AXIS, measure_rows_axis

    limit = engine.max_context - max(ROWS_AXIS) - 1
    surface = measure_rows_axis(engine.model, surface_contexts(prompt_lengths, max_tokens, limit), repeats=repeats)
    surface.source = f"measured at the start of the run ({surface.source})"
    return surface


def _plan_config(config: Any) -> dict[str, Any] | None:
    """A saved plan with the defaults of fields added since it was written (None if it is no plan)."""
    try:
        return asdict(RunPlan(**config))
    except TypeError:
        return None


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(
    run_dir: Path,
    plan: RunPlan,
    engine: TargetEngine,
    resume: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    slo: Any = None,
    started: float | None = None,
) -> Path:
    """Execute (or continue) the plan into ``run_dir``; returns the trace path. ``on_warning`` hears
    each workload warning (a bad JSONL line, a prompt over the budget) as the run starts; run.json
    keeps them too. With ``plan.budget_s`` the job races after its initial prompts and load points
    (:mod:`specledger.mainjob.race`), judging by ``slo`` (default SLO) until ``started`` (a
    ``time.monotonic()`` reading; default now) + the budget, less :data:`REPORT_RESERVE_S`."""
    from specledger.engine.device import machine_info
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.interleave import SideBySide
    from specledger.engine.sampling import SamplingParams
    from specledger.provenance import provenance
    from specledger.workloads import encode_item

    started = time.monotonic() if started is None else started
    plan.validate()
    run_dir.mkdir(parents=True, exist_ok=True)
    rd = RunDir(run_dir)
    trace_path = rd.trace_path
    loaded = engine.loaded
    items, warnings = load_items(plan, engine.model.config.vocab_size)
    encoded: dict[str, list[int]] = {}
    by_id: dict[str, Any] = {}
    skipped: list[str] = []

    def register(new_items: Sequence[Any]) -> list[str]:
        """Encode items that fit the prompt budget into ``encoded`` / ``by_id``; returns their ids."""
        ids = []
        for it in new_items:
            tokens = encode_item(loaded, it)
            if len(tokens) > plan.max_prompt_tokens or \
                    len(tokens) + plan.max_tokens_for(it.category) + max(plan.tree_budgets) > engine.max_context:
                skipped.append(f"{it.id}: prompt of {len(tokens)} tokens is over --max-prompt-tokens "
                               f"{plan.max_prompt_tokens}")
                continue
            encoded[it.id], by_id[it.id] = tokens, it
            ids.append(it.id)
        return ids

    register(items)
    if on_warning is not None:
        path = str(plan.workload_file or "")
        for message in warnings + [f"skipped {m}" for m in skipped]:
            on_warning(message if path and message.startswith(path) else f"workload {path}: {message}".replace(" :", ":"))
    room = engine.max_context - plan.max_tokens - 1
    require(max(plan.tree_budgets) <= room, f"tree budget {max(plan.tree_budgets)} exceeds the cache's room "
            f"({room} positions past max_tokens in a {engine.max_context}-token context); lower --tree-budgets")
    require(bool(by_id), "no workload item fits the prompt budget; raise --max-prompt-tokens")

    # One drafter instance per setting (drafter, gamma, temperature): a cross-request drafter
    # (suffix) must not learn a prompt's answer from another setting's run of the same prompt.
    layers = plan.layers
    drafter_info: dict[str, Any] = {}
    if "layerskip" in plan.drafters and not layers:
        layers = ",".join(map(str, make_drafter("layerskip", engine).layers))  # calibrate once
    if "layerskip" in plan.drafters:
        drafter_info["layerskip_layers"] = layers
    drafters: dict[tuple[str, int, float, int], Any] = {}
    shapes: dict[str, Any] = {}
    if any(plan.tree_budgets) and plan.tree_shape != "dynamic":  # the DP's static shape, per drafter
        from specledger.predict.tree_shape_spec import tree_shape_from_spec

        shapes = {d: tree_shape_from_spec(plan.tree_shape, d) for d in plan.drafters}
        drafter_info["tree_shape"] = {d: s.source for d, s in shapes.items()}

    def drafter_for(job: Job) -> Any:
        key = (job.drafter, job.gamma, job.temperature, job.tree_budget)
        if key not in drafters:
            drafters[key] = make_drafter(job.drafter, engine, layers=layers, draft_path=plan.draft)
            if job.tree_budget:
                drafters[key].tree_shape = shapes.get(job.drafter)
        return drafters[key]

    def prompt_facts() -> dict[str, Any]:
        return {pid: {"category": it.category, "prompt_tokens": len(encoded[pid]), "token_ids": encoded[pid]}
                for pid, it in by_id.items()}

    meta = {
        "name": run_dir.name,
        "model": engine.name,
        "dtype": engine.dtype,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "provenance": provenance(),
        "weight_bytes": engine.model.weight_bytes(),
        "config": asdict(plan),
        "drafters": drafter_info,
        "workload_warnings": warnings,
        "skipped_prompts": skipped,
        "prompts": prompt_facts(),
    }
    if any(x > 1 for x in plan.loads):  # what the KV-capacity gate needs (m_KV from the model config)
        from specledger.mainjob.loads import memory_facts

        meta.update(memory_facts(engine))
    old: dict[str, Any] = {}
    if resume and rd.meta_path.exists():
        old = rd.meta(f"restart the run with another --out instead of --resume {run_dir}")
        if _plan_config(old.get("config")) != meta["config"]:
            raise SpecLedgerError(f"{run_dir} was started with another configuration; resume it without options")
        if (old.get("model"), str(old.get("dtype"))) != (meta.get("model"), str(meta.get("dtype"))):
            raise SpecLedgerError(f"{run_dir} was measured on {old.get('model')} ({old.get('dtype')}), not "
                                  f"{meta.get('model')} ({meta.get('dtype')}): resume it with the --target and "
                                  "--dtype it started with, or start a new run with --out")
        meta["started"] = old.get("started", meta["started"])
        for pid, facts in (old.get("prompts") or {}).items():  # prompts a race had added
            if pid not in encoded and isinstance(facts, dict) and facts.get("token_ids"):
                encoded[pid] = list(facts["token_ids"])
    elif not resume and trace_path.exists() and trace_path.stat().st_size:
        raise SpecLedgerError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    if resume and rd.meta_path.exists() and old.get(SURFACE_KEY):
        meta[SURFACE_KEY] = old[SURFACE_KEY]
    else:
        if progress:
            progress(0, 1, "measuring the verify cost surface (rows 1-33)")
        meta[SURFACE_KEY] = measure_run_surface(engine, [len(v) for v in encoded.values()],
                                                max(plan.max_tokens_for(it.category) for it in by_id.values())
                                                ).to_dict()
    if plan.budget_s is not None:
        check_budget(plan, meta[SURFACE_KEY], time.monotonic() - started, sorted({it.category for it in items}))
    rd.write_meta(meta)
    if resume:  # what a kill inside an atomic write left (a report's temp copy): rewritten before the end
        rd.remove_stale_temp_files()
    if resume and (removed := rd.repair_tail()):
        warn(f"{trace_path}: removed the torn last line ({removed} bytes) the interruption left; "
             "that request runs again", SpecLedgerWarning, stacklevel=2)

    from specledger.quality import answer_complete, score

    side_by_side = SideBySide()  # one KV cache per request in flight (a prompt's settings)

    def request(job: Job) -> tuple[TargetEngine, list[int], dict[str, Any]]:
        return engine, encoded[job.prompt_id], dict(
            drafter=drafter_for(job), gamma=job.gamma, params=SamplingParams(temperature=job.temperature, seed=plan.seed),
            max_tokens=plan.max_tokens_for(by_id[job.prompt_id].category),
            request_id=f"{job.prompt_id}|{job.drafter}|{job.gamma}|{job.temperature:g}"
            + (f"|tree{job.tree_budget}" if job.tree_budget else ""), tree_budget=job.tree_budget)

    def execute(jobs: Sequence[Job], finished: int, total: int) -> int:
        """Run ``jobs`` side by side per prompt, append their records; returns the new finished count."""
        for group in job_groups(jobs, plan.interleave_rounds):
            item = by_id[group[0].prompt_id]
            if progress:
                what = ", ".join(f"{j.drafter} γ={j.gamma}" + (f" tree={j.tree_budget}" if j.tree_budget else "")
                                 for j in group)
                progress(finished, total, f"{item.category} T={group[0].temperature:g}: {what}")
            records = side_by_side.run([request(job) for job in group])
            for rec in records:
                rec.category = item.category
                rec.prompt_id = item.id
                rec.extra["max_tokens"] = plan.max_tokens_for(item.category)  # this request's own output budget
                rec.extra["quality"] = score(item, rec.text)
                if (complete := answer_complete(item, rec.text, rec.stop_reason)) is not None:
                    rec.extra["quality_complete"] = complete
                rec.extra["peak_memory_bytes"] = peak_rss_bytes()
            rd.append(records)
            finished += len(group)
        return finished

    initial_ids = [pid for pid in by_id if pid in {it.id for it in items}]
    jobs = plan_jobs(initial_ids, plan)
    done = done_keys(rd) if resume else set()
    todo = [j for j in jobs if j.key not in done]
    finished = execute(todo, len(jobs) - len(todo), len(jobs))
    at_loads = any(x > 1 for x in plan.loads)
    survivors = None
    if plan.budget_s is not None:
        reserve = REPORT_RESERVE_S + (LOAD_POINTS_SHARE * plan.budget_s if at_loads else 0.0)
        log = _race(rd, plan, by_id, register, execute, done, slo, started, progress, {it.id for it in items},
                    reserve)
        survivors = survivor_settings(log.final, plan)
        meta["prompts"] = prompt_facts()
        meta["race"] = {**log.to_dict(), "load_point_settings": [f"{d} γ={g}" for d, g in survivors[1:]]}
        rd.write_meta(meta)
    if at_loads:  # after the race: only the settings it left in contention, on the initial prompts
        from specledger.mainjob.loads import run_load_points

        run_load_points(rd, plan, engine, {pid: by_id[pid] for pid in initial_ids},
                        {pid: encoded[pid] for pid in initial_ids}, layers, progress, survivors)
    elif progress:
        progress(finished, len(jobs), "done")
    return trace_path


#: share of the budget kept for the load points, which run after the race with the settings it left
LOAD_POINTS_SHARE = 0.15
#: speculative settings the load points keep after a race: the ones most categories' decisions stand on
LOAD_POINT_SETTINGS = 2


def survivor_settings(decisions: Sequence[dict[str, Any]], plan: RunPlan) -> list[tuple[str, int]]:
    """Plain, then the (drafter, γ) most categories' decisions stand on after the race (the chosen setting of
    a deploy, the leader of an open decision; chains only), at most :data:`LOAD_POINT_SETTINGS` of them; the
    plan's first chain setting when the decisions name none (everything off: the loads then show why)."""
    votes: dict[tuple[str, int], int] = {}
    for v in decisions:
        if v.get("decision") in ("control", "no-decision") or not v.get("setting"):
            continue
        if v.get("decision") == "off" and v.get("resolved"):
            continue
        drafter, _, gamma = str(v["setting"]).partition(" γ=")
        if gamma.isdigit():
            votes[(drafter, int(gamma))] = votes.get((drafter, int(gamma)), 0) + 1
    order = [(d, g) for d in plan.drafters for g in plan.gammas_for(d)]
    keep = sorted(votes, key=lambda k: (-votes[k], order.index(k) if k in order else len(order)))
    keep = keep[:LOAD_POINT_SETTINGS] or order[:1]
    return [("none", 0)] + sorted(keep, key=lambda k: order.index(k) if k in order else len(order))


def check_budget(plan: RunPlan, surface: dict[str, Any], spent_s: float, categories: Sequence[str] = ()) -> None:
    """One-line error when ``plan.budget_s`` cannot hold what one prompt needs: the time already spent on
    start-up plus one prompt of every setting, priced at the measured 1-row step (a lower bound: draft
    passes and prefill come on top), plus :data:`REPORT_RESERVE_S`."""
    steps = [float(p["seconds"]) for p in surface.get("points") or [] if int(p.get("rows", 0)) == 1]
    step = min(steps) if steps else 0.01
    settings = 1 + sum(len(plan.gammas_for(d)) * len(plan.tree_budgets) for d in plan.drafters)
    tokens = max(plan.max_tokens_for(c) for c in categories) if categories else plan.max_tokens
    one_prompt = settings * tokens * step * len(plan.temperatures)
    need = spent_s + one_prompt + REPORT_RESERVE_S
    require(plan.budget_s >= need,
            f"--budget {plan.budget_s:g}s is below what one prompt needs here (≈ {need:.0f} s: start-up "
            f"{spent_s:.0f} s, {settings} settings × {tokens} tokens × {1e3 * step:.1f} ms per step, "
            f"{REPORT_RESERVE_S:.0f} s for the report); raise --budget to at least {math.ceil(need)}s")


def _race(rd: RunDir, plan: RunPlan, by_id: dict[str, Any], register: Callable[[Sequence[Any]], list[str]],
          execute: Callable[[Sequence[Job], int, int], int], done: set, slo: Any, started: float,
          progress: Callable[[int, int, str], None] | None, used: set[str], reserve_s: float) -> Any:
    """Race rounds until the budget (see :mod:`specledger.mainjob.race`); returns the race log."""
    from specledger.gates import SLO, with_measured_margin
    from specledger.gates.solo import solo_decisions
    from specledger.mainjob.race import RaceLog, Setting, race

    log = RaceLog(budget_s=float(plan.budget_s), started=started)
    pool = PromptPool(plan, set(by_id) | used)
    settings = [Setting(d, g, b) for d in plan.drafters for g in plan.gammas_for(d) for b in plan.tree_budgets]
    counter = {"n": 0}

    def decide() -> list[dict[str, Any]]:
        records = rd.records_so_far()
        return solo_decisions(records, with_measured_margin(slo or SLO(), records), n_resamples=0)

    def more(category: str, k: int) -> list[str]:
        """Up to ``k`` new prompts that fit the prompt budget (long ones are skipped, and more are drawn)."""
        ids: list[str] = []
        while len(ids) < k and (batch := pool.more(category, k - len(ids))):
            ids += register(batch)
        return ids

    def run_prompts(category: str, temperature: float, ids: list[str], keep: list[Any], with_plain: bool) -> None:
        jobs = [j for pid in ids for j in [Job(pid, "none", 0, temperature)][: int(with_plain)]
                + [Job(pid, s.drafter, s.gamma, temperature, s.tree_budget) for s in keep]]
        jobs = [j for j in jobs if j.key not in done]
        if progress:
            progress(0, 0, f"race: {category} +{len(ids)} prompts")
        counter["n"] = execute(jobs, counter["n"], counter["n"] + len(jobs))

    def prompts_so_far(category: str) -> int:
        return sum(1 for it in by_id.values() if it.category == category)

    deadline = started + float(plan.budget_s) - reserve_s
    return race(log, deadline, decide, more, run_prompts, settings, prompts_so_far, step=plan.race_step)
