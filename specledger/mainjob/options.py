"""``specledger run``'s options as given (:class:`RunOptions`) and the plan they make: a preset with the
options over it, or a resumed run's own plan (:func:`plan_from_options`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from specledger.command_options import TargetOptions
from specledger.errors import SpecLedgerError
from specledger.load_points import is_load_range, parse_loads
from specledger.mainjob.plan import RunPlan, preset


@dataclass
class RunOptions(TargetOptions):
    """The options of ``specledger run`` as typed (None: the preset's); see the verb's help for each."""

    quick: bool = False
    full: bool = False
    resume: Path | None = None
    categories: str | None = None
    drafters: str | None = None
    gammas: str | None = None
    tree_budgets: str | None = None
    tree_shape: str | None = None
    temperatures: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    device: str = "cpu"
    loads: str | None = None
    simulate_loads: str | None = None
    slo: Path | None = None
    budget: str | None = None
    verbose: bool = False
    sequential: bool = False
    mix: str | None = None


def _csv(text: str | None, cast=str) -> list | None:
    from specledger.bench.sweep import parse_csv

    return None if text is None else parse_csv(text, cast)


def parse_budget(text: str | None) -> float | None | bool:
    """"330", "90s", "6m", "1h" -> seconds; "none" -> False (no race); None -> None (the preset's)."""
    if text is None:
        return None
    t = text.strip().lower()
    if t in ("none", "off", "0"):
        return False
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    number = t[:-1] if scale else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < float("inf")):
        raise SpecLedgerError(f"--budget {text!r} is not a time; give seconds or minutes, e.g. 330, 90s or 6m")
    return value


#: a lower bound of the start-up before the first prompt: loading the target and measuring its verify cost surface
#: (9 timed passes); 42-70 s on the reference 2-core machine with the bundled SmolLM2-135M
START_UP_FLOOR_S = 30.0
#: a lower bound of one decode step (the bundled target decodes 420-483 tok/s at best on that machine)
STEP_FLOOR_S = 0.002


def budget_floor_s(plan: RunPlan) -> tuple[float, str]:
    """(seconds, how): the least a run of ``plan`` can take before its first decision, known before any model
    loads -- :data:`START_UP_FLOOR_S`, one prompt of every setting at :data:`STEP_FLOOR_S` per token (``max_tokens``
    tokens), and the report's reserve. A lower bound: the run's own check after
    start-up (:func:`specledger.mainjob.plan.check_budget`) prices the measured step."""
    from specledger.mainjob.plan import REPORT_RESERVE_S

    settings = plan.settings_per_prompt
    tokens = plan.max_tokens  # the categories' own (longer) budgets left out: a lower bound
    one_prompt = settings * tokens * STEP_FLOOR_S * len(plan.temperatures)
    need = START_UP_FLOOR_S + one_prompt + REPORT_RESERVE_S
    how = (f"start-up >= {START_UP_FLOOR_S:.0f} s to load the target and measure its costs, {settings} settings × "
           f"{tokens} tokens × >= {1e3 * STEP_FLOOR_S:.0f} ms per step, {REPORT_RESERVE_S:.0f} s for the report")
    return need, how


def check_inputs(plan: RunPlan) -> list[str]:
    """Every check of ``run``'s inputs that needs no model, made before a run folder exists or anything is
    measured: the plan's own rules, the workload file read by the one reader ``run`` and ``probe`` share
    (:func:`specledger.workloads.load_jsonl`: a missing file or a malformed line is one error naming it),
    ``--mix`` against the categories the run measures, and ``--budget`` against :func:`budget_floor_s`.
    Returns the workload's warnings (folded per kind)."""
    plan.validate()
    warnings: list[str] = []
    categories = list(plan.categories)
    if plan.workload_file:
        from specledger.workloads.jsonl import load_jsonl

        items, warnings = load_jsonl(plan.workload_file)
        categories = [it.category for it in items]
    if plan.mix:  # a category the run will not measure fails here, as probe's --mix does
        from specledger.gates.mix import mix_weights

        mix_weights(categories, given=plan.mix)
    if plan.budget_s:
        need, how = budget_floor_s(plan)
        if plan.budget_s < need:
            raise SpecLedgerError(f"--budget {plan.budget_s:g}s is below what one prompt needs (≈ {need:.0f} s: "
                                  f"{how}); raise --budget to at least {math.ceil(need)}s")
    return warnings


def resumed_plan(resume: Path) -> RunPlan:
    """The plan a run directory was started with (``--resume``); one-line errors when it holds none."""
    from specledger.rundir import META_NAME, RunDir

    rd = RunDir(resume)
    if not rd.meta_path.exists():
        if resume.is_dir() and not (rd.trace_path.exists() and rd.trace_path.stat().st_size):
            raise SpecLedgerError(f"{resume} has no {META_NAME}: the run stopped before it wrote its plan, and "
                                  f"nothing was measured; start it again with --out {resume}")
        raise SpecLedgerError(f"{resume} has no {META_NAME}; it is not a run directory")
    meta = rd.meta(f"start a new run with --out instead of --resume {resume}")
    try:
        return RunPlan(**meta["config"])
    except (KeyError, TypeError):
        raise SpecLedgerError(f"{rd.meta_path} holds no run plan ('config'); start a new run with --out") from None


def plan_from_options(opts: RunOptions, budget_s: float | None | bool) -> tuple[RunPlan, Path]:
    """(plan, run directory): the resumed run's own plan with ``--resume``, else the preset (quick, full or
    default) with every option given over it; ``budget_s`` is :func:`parse_budget`'s reading."""
    if opts.resume is not None:
        return resumed_plan(opts.resume), opts.resume
    from specledger.gates.mix import parse_mix

    plan = preset("quick" if opts.quick else "full" if opts.full else "default")
    for attr, value in (
        ("categories", _csv(opts.categories)), ("drafters", _csv(opts.drafters)), ("gammas", _csv(opts.gammas, int)),
        ("model_gammas", _csv(opts.gammas, int)), ("tree_budgets", _csv(opts.tree_budgets, int)),
        ("tree_shape", opts.tree_shape), ("temperatures", _csv(opts.temperatures, float)),
        ("n_per_category", opts.n), ("max_tokens", opts.max_tokens), ("layers", opts.layers), ("draft", opts.draft),
        ("seed", opts.seed if opts.seed else None), ("workload_file", str(opts.workload) if opts.workload else None),
        ("loads", parse_loads(opts.loads, allow_range=True)),
        ("locate_loads", is_load_range(opts.loads) if opts.loads is not None else None),
        ("simulate_loads", parse_loads(opts.simulate_loads, "--simulate-loads", "64,256", allow_none=True)),
        ("mix", parse_mix(opts.mix)),
    ):
        if value is not None:
            setattr(plan, attr, value)
    if opts.max_tokens is not None:
        plan.category_max_tokens = {}
    if budget_s is not None:
        plan.budget_s = budget_s or None
    plan.interleave_rounds = not opts.sequential
    return plan, opts.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
