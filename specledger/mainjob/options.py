"""``specledger run``'s options as given (:class:`RunOptions`) and the plan they make: a preset with the
options over it, or a resumed run's own plan (:func:`plan_from_options`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specledger.errors import SpecLedgerError
from specledger.load_points import parse_loads
from specledger.mainjob.plan import RunPlan, preset


@dataclass
class RunOptions:
    """The options of ``specledger run`` as typed (None: the preset's); see the verb's help for each."""

    quick: bool = False
    full: bool = False
    out: Path | None = None
    resume: Path | None = None
    categories: str | None = None
    drafters: str | None = None
    gammas: str | None = None
    tree_budgets: str | None = None
    tree_shape: str | None = None
    temperatures: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    workload: Path | None = None
    target: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    layers: str | None = None
    draft: str | None = None
    loads: str | None = None
    simulate_loads: str | None = None
    slo: Path | None = None
    seed: int = 0
    budget: str | None = None
    verbose: bool = False
    sequential: bool = False


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
    plan = preset("quick" if opts.quick else "full" if opts.full else "default")
    for attr, value in (
        ("categories", _csv(opts.categories)), ("drafters", _csv(opts.drafters)), ("gammas", _csv(opts.gammas, int)),
        ("model_gammas", _csv(opts.gammas, int)), ("tree_budgets", _csv(opts.tree_budgets, int)),
        ("tree_shape", opts.tree_shape), ("temperatures", _csv(opts.temperatures, float)),
        ("n_per_category", opts.n), ("max_tokens", opts.max_tokens), ("layers", opts.layers), ("draft", opts.draft),
        ("seed", opts.seed if opts.seed else None), ("workload_file", str(opts.workload) if opts.workload else None),
        ("loads", parse_loads(opts.loads)),
        ("simulate_loads", parse_loads(opts.simulate_loads, "--simulate-loads", "64,256", allow_none=True)),
    ):
        if value is not None:
            setattr(plan, attr, value)
    if opts.max_tokens is not None:
        plan.category_max_tokens = {}
    if budget_s is not None:
        plan.budget_s = budget_s or None
    plan.interleave_rounds = not opts.sequential
    return plan, opts.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
