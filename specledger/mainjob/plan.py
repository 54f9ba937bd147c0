"""What the main job runs: the plan (:class:`RunPlan`, its presets), its jobs (one request each: prompt,
drafter, γ, temperature, tree budget) and how they group side by side, the budget check before a race and
the settings the load points keep after it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specledger.cost.serialized import CostSurfaceDict
from specledger.engine.drafters import catalog
from specledger.engine.drafters.catalog import LAYERSKIP, MODEL, NGRAM, PLAIN, QUANT_SELF, SUFFIX
from specledger.errors import SpecLedgerError, require
from specledger.gates.decision import CONTROL, NO_DECISION, Verdict
from specledger.mainjob.race import Setting
from specledger.workloads.context_buckets import split_key

DEFAULT_CATEGORIES = ("code", "code-edit", "extraction", "agent", "dialogue", "summary", "math", "random")
#: drafters of ``make run`` (the default preset): the model-free ones, which pay on this CPU. layerskip (S about
#: 0.5 here: a draft pass costs most of a verify pass) is dropped by every race at its first look, so it only
#: cost the budget; --drafters ngram,suffix,layerskip or --full runs it (--full adds quant-self too)
DEFAULT_DRAFTERS = (NGRAM.name, SUFFIX.name)
#: concurrencies of the presets (1 = the solo job); chosen so that ``make run`` fits 10 minutes on 2 cores
#: (estimated: load 16 adds about 2 minutes to the default run, load 4 about 2.5 more: ``--loads 1,4,16``); the
#: default preset bisects between them (``--loads 1..16``) as far as its budget allows
DEFAULT_LOADS = (1, 16)
QUICK_LOADS = (1, 16)
FULL_LOADS = (1, 2, 4, 8, 16, 32)
#: simulated after every preset's measured part (:mod:`specledger.gates.simulated_loads`): about a second on 2 cores
SIMULATED_LOADS = (64,)
#: ``make run``'s time budget (seconds, from the start of ``specledger run`` to its report): with set-up on a
#: fresh clone it fits 8 minutes on 2 cores; racing spends what the initial prompts leave
DEFAULT_BUDGET_S = 360.0
#: ``--quick``'s budget
QUICK_BUDGET_S = 150.0
#: prompts per category before racing: 2, the least a per-prompt spread needs; the decisions' confidence
#: sequence (:mod:`specledger.analysis.sequential`) gives no interval below 4 prompts, so every category races at
#: least one round, with every setting still in it; the race adds prompts only where decisions stay open
DEFAULT_INITIAL_PROMPTS = 2
#: the prompt budget of the ``long`` category (documents to about 5k tokens; the default target holds 8k)
LONG_MAX_PROMPT_TOKENS = 6144
#: kept back from the budget for the summary, the report and the simulated loads after the race
REPORT_RESERVE_S = 30.0
#: output budgets where the task metric needs room: HumanEval a whole function, ASDiv a stated answer
QUALITY_MAX_TOKENS = {"code": 96, "math": 64}


@dataclass
class RunPlan:
    """What to run. Presets: :func:`preset` ("quick" ~1 min, "default" ~5 min, "full" hours on 2 cores)."""

    categories: list[str] = field(default_factory=lambda: list(DEFAULT_CATEGORIES))
    n_per_category: int = 2
    drafters: list[str] = field(default_factory=lambda: [NGRAM.name, SUFFIX.name, LAYERSKIP.name, QUANT_SELF.name])
    gammas: list[int] = field(default_factory=lambda: [2, 4])
    #: gammas for drafters that run a network (layerskip, quant-self, model, head); None = ``gammas``.
    #: Their rounds cost a draft pass per candidate, so the default run samples fewer of them.
    model_gammas: list[int] | None = field(default_factory=lambda: [2])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    #: token-tree node budgets per round for every drafter x gamma (0 = a chain; a tree's depth <= gamma)
    tree_budgets: list[int] = field(default_factory=lambda: [0])
    #: which tree a tree round proposes: dynamic (EAGLE-2 best-first) or the DP's static shape
    #: (dp, dp:p1,p2,.., dp:RUN_DIR; :mod:`specledger.mainjob.tree_shape_spec`)
    tree_shape: str = "dynamic"
    max_tokens: int = 40
    max_prompt_tokens: int = 1536
    seed: int = 0
    layers: str | None = None  # layerskip layers; None = calibrate
    draft: str | None = None  # draft model path for the model drafter (catalog.MODEL)
    workload_file: str | None = None
    #: also run ``specledger sweep``'s experiments (quant4, policies, serving) into the run directory
    side_experiments: bool = False
    #: concurrencies: 1 is the solo job above; every load > 1 runs each setting under continuous
    #: batching, closed loop over the same prompts (:mod:`specledger.mainjob.measured_loads`)
    loads: list[int] = field(default_factory=lambda: [1])
    #: ``--loads A..B``: ``loads`` holds the ends, and the job bisects between them where the decision changes
    #: until each change is bracketed within 2× (:mod:`specledger.load_bisect`), within the budget
    locate_loads: bool = False
    #: loads beyond the measured ones, simulated from this run after it (:mod:`specledger.gates.simulated_loads`);
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
    #: the traffic's shares per category for the one recommendation over all of them (``--mix``,
    #: :func:`specledger.gates.mix.parse_mix`); None: each category's share of the workload's requests
    mix: dict[str, float] | None = None
    #: decide per context bucket where a category's prompts fall in two or more (:mod:`specledger.mainjob.buckets`)
    context_buckets: bool = True

    def max_tokens_for(self, category: str) -> int:
        return int(self.category_max_tokens.get(category, self.max_tokens))

    def max_prompt_tokens_for(self, category: str) -> int:
        """The prompt budget: ``max_prompt_tokens`` for the built-in categories (it keeps a preset's time in check),
        at least :data:`LONG_MAX_PROMPT_TOKENS` for ``long``, and none but the model's context for a workload
        file's prompts (they are the user's traffic)."""
        if self.workload_file:
            return 1 << 30
        long = split_key(category)[0] == "long"
        return max(self.max_prompt_tokens, LONG_MAX_PROMPT_TOKENS) if long else self.max_prompt_tokens

    @property
    def settings_per_prompt(self) -> int:
        """Requests each prompt gets per temperature: plain, then every drafter x γ x tree budget."""
        return 1 + sum(len(self.gammas_for(d)) * len(self.tree_budgets) for d in self.drafters)

    def gammas_for(self, drafter: str) -> list[int]:
        spec = catalog.find(drafter)
        neural = spec is not None and spec.needs_network
        return self.model_gammas if neural and self.model_gammas is not None else self.gammas

    def validate(self) -> None:
        require(self.n_per_category >= 1, "--n must be >= 1")
        require(all(g >= 1 for g in self.gammas + (self.model_gammas or [])),
                "gammas must be >= 1 (plain decoding is always run as the baseline)")
        require(all(t >= 0 for t in self.temperatures), "temperatures must be >= 0")
        require(bool(self.tree_budgets) and all(isinstance(b, int) and b >= 0 for b in self.tree_budgets),
                "--tree-budgets must be integers >= 1 (0 = chain), e.g. 0,8,16")
        require(len(set(self.tree_budgets)) == len(self.tree_budgets), "--tree-budgets must be distinct")
        from specledger.mainjob.tree_shape_spec import check_tree_shape

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
        for d in self.drafters:
            catalog.check_drafter(d)
        require(MODEL.name not in self.drafters or self.draft, f"the {MODEL.name!r} drafter needs --draft PATH")


def preset(name: str) -> RunPlan:
    if name == "quick":  # two prompts per category: the least that gives a bootstrap CI, hence a verdict
        return RunPlan(categories=["code-edit", "dialogue", "math"], n_per_category=2,
                       drafters=[NGRAM.name, SUFFIX.name, LAYERSKIP.name], gammas=[4], max_tokens=40,
                       loads=list(QUICK_LOADS), category_max_tokens=dict(QUALITY_MAX_TOKENS),
                       simulate_loads=list(SIMULATED_LOADS), budget_s=QUICK_BUDGET_S)
    if name == "default":  # quant-self (S ~0.5 on this CPU, a third of the run's time) is left to --full
        return RunPlan(n_per_category=DEFAULT_INITIAL_PROMPTS, drafters=list(DEFAULT_DRAFTERS),
                       loads=list(DEFAULT_LOADS), locate_loads=True, category_max_tokens=dict(QUALITY_MAX_TOKENS),
                       simulate_loads=list(SIMULATED_LOADS), budget_s=DEFAULT_BUDGET_S)
    if name == "full":
        return RunPlan(categories=[*DEFAULT_CATEGORIES[:-1], "long", "random"], n_per_category=8,
                       gammas=[1, 2, 3, 4, 6, 8], model_gammas=None, temperatures=[0.0, 0.8],
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
            jobs.append(Job(pid, PLAIN.name, 0, t))
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


def plan_config(config: Any) -> RunPlan | None:
    """A saved plan (``run.json``'s ``config``) with the defaults of fields added since it was written (None if it
    is no plan)."""
    try:
        return RunPlan(**config)
    except TypeError:
        return None


#: share of the budget kept for the load points, which run after the race with the settings it left
LOAD_POINTS_SHARE = 0.15
#: speculative settings the load points keep after a race: the ones most categories' decisions stand on
LOAD_POINT_SETTINGS = 2


def survivor_settings(decisions: Sequence[Verdict], plan: RunPlan) -> list[tuple[str, int]]:
    """Plain, then the (drafter, γ) most categories' decisions stand on after the race (the chosen setting of
    a deploy, the leader of an open decision; chains only), at most :data:`LOAD_POINT_SETTINGS` of them; the
    plan's first chain setting when the decisions name none (everything off: the loads then show why)."""
    votes: dict[tuple[str, int], int] = {}
    for v in decisions:
        if v.decision in (CONTROL, NO_DECISION) or (v.is_off and v.resolved):
            continue
        s = Setting.parse(v.setting or "")
        if s is not None and isinstance(s.gamma, int) and not s.tree_budget:
            votes[(s.drafter, s.gamma)] = votes.get((s.drafter, s.gamma), 0) + 1
    order = [(d, g) for d in plan.drafters for g in plan.gammas_for(d)]
    keep = sorted(votes, key=lambda k: (-votes[k], order.index(k) if k in order else len(order)))
    keep = keep[:LOAD_POINT_SETTINGS] or order[:1]
    return [(PLAIN.name, 0)] + sorted(keep, key=lambda k: order.index(k) if k in order else len(order))


def _surface_at(surface: CostSurfaceDict, context: int) -> tuple[float, float]:
    """(one-row step, marginal seconds per extra row) at the measured context nearest ``context``."""
    points = [p for p in surface.get("points") or [] if int(p.get("batch", 1) or 1) == 1]
    if not points:
        return 0.01, 0.0
    nearest = min({int(p["context"]) for p in points}, key=lambda c: abs(c - context))
    at = {int(p["rows"]): float(p["seconds"]) for p in points if int(p["context"]) == nearest}
    one, top = at.get(1, min(at.values())), max(at)
    return one, (at[top] - one) / (top - 1) if top > 1 else 0.0


def initial_seconds(plan: RunPlan, surface: CostSurfaceDict, prompts: Sequence[tuple[str, int]]) -> float:
    """An estimate of the initial prompts' time: per (category, prompt tokens n), one prefill, shared by the
    prompt's settings (n rows at the surface's marginal row cost at its shortest context: a prefill's linears),
    and every setting's output at the one-row step at that context; draft passes come on top. On the AVX2 EPYC a
    prefill measured 0.5x (512 tokens) to 0.85x (4,096 tokens) this price."""
    settings = plan.settings_per_prompt
    per_row, total = _surface_at(surface, 0)[1], 0.0
    for category, n in prompts:
        total += n * per_row + settings * plan.max_tokens_for(category) * _surface_at(surface, n)[0] \
            * len(plan.temperatures)
    return total


def check_budget(plan: RunPlan, surface: CostSurfaceDict, spent_s: float, categories: Sequence[str] = ()) -> None:
    """One-line error when ``plan.budget_s`` cannot hold what one prompt needs: the time already spent on
    start-up plus one prompt of every setting, priced at the measured 1-row step (a lower bound: draft
    passes and prefill come on top), plus :data:`REPORT_RESERVE_S`."""
    steps = [float(p["seconds"]) for p in surface.get("points") or [] if int(p.get("rows", 0)) == 1]
    step = min(steps) if steps else 0.01
    settings = plan.settings_per_prompt
    tokens = max(plan.max_tokens_for(c) for c in categories) if categories else plan.max_tokens
    one_prompt = settings * tokens * step * len(plan.temperatures)
    need = spent_s + one_prompt + REPORT_RESERVE_S
    require(plan.budget_s >= need,
            f"--budget {plan.budget_s:g}s is below what one prompt needs here (≈ {need:.0f} s: start-up "
            f"{spent_s:.0f} s, {settings} settings × {tokens} tokens × {1e3 * step:.1f} ms per step, "
            f"{REPORT_RESERVE_S:.0f} s for the report); raise --budget to at least {math.ceil(need)}s")
