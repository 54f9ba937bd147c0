"""The side experiments as a library: quantization four-way and speculation-length policies at
concurrency 1, and serving (continuous batching under load and long context), written into a run
directory; ``specledger sweep`` (:mod:`specledger.cli.sweep`) and ``specledger run --full``
call them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict

from specledger.engine.drafters.catalog import NGRAM, check_drafter
from specledger.engine.protocol import TargetEngine
from specledger.errors import SpecLedgerError, require


class SweepServingConfigDict(TypedDict):
    """run.json ``sweep.serving``: the serving experiment's settings as asked."""

    concurrencies: list[int]
    rates: list[float]  # Poisson request rates, req/s
    contexts: list[int]  # context lengths, tokens
    drafters: list[str]  # "drafter:γ"
    max_tokens: int
    repeats: int
    context_concurrencies: list[int]
    context_sources: list[str]


class _SweepConfigKeys(TypedDict):
    experiment: str
    categories: list[str]
    n: int  # prompts per category
    max_tokens: int
    drafter: str
    gamma: int
    quant_drafters: list[str]  # "drafter:γ" candidates of the four-way
    gammas: list[int]  # the policies experiment's static γ's
    tree_budgets: list[int]
    policies: list[str]
    seed: int
    workload_file: str | None


class SweepConfigDict(_SweepConfigKeys, total=False):
    """run.json ``sweep``: what ``specledger sweep`` was asked; ``serving`` when the serving experiment runs."""

    serving: SweepServingConfigDict


class SideExperimentSettingsDict(TypedDict, total=False):
    """The side experiments' settings (``specledger run --full``; a key given overrides the default's)."""

    categories: list[str]
    n: int  # prompts per category
    max_tokens: int
    drafter: str  # the policies experiment's drafter
    gamma: int
    quant_drafters: str  # the four-way's candidates, "drafter:γ,..."
    static_gammas: list[int]
    policies: list[str]
    concurrencies: list[int]
    serving_drafters: str  # "drafter:γ,..." (γ may name a policy)
    serving_max_tokens: int
    repeats: int
    contexts: list[int]  # context lengths, tokens
    context_to_limit: bool  # add the longest context the model takes
    context_concurrencies: list[int]
    context_sources: list[str]


def parse_csv(text: str, cast: Any = str) -> list:
    """``"1, 2,4"`` -> [cast("1"), cast("2"), cast("4")]; a value ``cast`` rejects is a SpecLedgerError."""
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLedgerError(f"cannot parse list {text!r}; give comma-separated values like 1,2,4") from None


def parse_drafter_gammas(text: str) -> list[tuple[str, int | str]]:
    """``"ngram:4,suffix:4,ngram:goodput"`` -> [("ngram", 4), ("suffix", 4), ("ngram", "goodput")]; a
    missing ``:γ`` means γ = 4; a policy name (heuristic, ema, batch, goodput) picks γ per request and step."""
    from specledger.engine.policy import POLICIES

    out: list[tuple[str, int | str]] = []
    for part in parse_csv(text):
        name, _, g = part.partition(":")
        g = g.strip()
        if g in POLICIES and g != "static":
            out.append((name.strip(), g))
            continue
        try:
            gamma = int(g) if g else 4
        except ValueError:
            raise SpecLedgerError(
                f"cannot parse {part!r}; write drafter:gamma or drafter:policy, e.g. ngram:4 or ngram:goodput"
            ) from None
        out.append((name.strip(), gamma))
    require(bool(out), "--serving-drafters is empty; give e.g. ngram:4,suffix:4")
    return out


def parse_quant_candidates(text: str) -> list[tuple[str, int]]:
    """``"ngram:2,suffix:4"`` -> [("ngram", 2), ("suffix", 4)]: the four-way's drafter candidates (static γ only)."""
    out = []
    for name, g in parse_drafter_gammas(text):
        require(isinstance(g, int) and g >= 1, f"--quant-drafters takes static gammas >= 1 (e.g. ngram:4), not {g!r}")
        check_drafter(name, " in --quant-drafters")
        out.append((name, int(g)))
    return list(dict.fromkeys(out))


def load_sweep_items(categories: list[str], n: int, seed: int, workload: Path | None, vocab_size: int
                     ) -> tuple[list, list[str]]:
    """Built-in categories (seeded sample of ``n`` each) or the user's JSONL: (items, warnings)."""
    from specledger.workloads import run_items

    require(n >= 1, "--n must be >= 1")
    return run_items(categories, n, seed, str(workload) if workload else None, vocab_size)


def write_meta(run_dir: Path, engine: TargetEngine, config: SweepConfigDict, warnings: list[str]) -> None:
    """``run.json`` for a fresh sweep directory; an existing one (a main run's) is left untouched."""
    from specledger.engine.device import machine_info
    from specledger.rundir import RunDir

    run = RunDir(run_dir)
    if run.meta_path.exists():
        return
    meta = {
        "name": run_dir.name,
        "kind": "sweep",
        "model": engine.name,
        "dtype": engine.dtype,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "weight_bytes": engine.model.weight_bytes() if hasattr(engine.model, "weight_bytes") else None,
        "sweep": config,
        "workload_warnings": warnings,
    }
    run.write_meta(meta)


# ``specledger run --full`` runs the side experiments too, with these settings, into the same directory.
FULL_SIDE_EXPERIMENTS: SideExperimentSettingsDict = {
    "categories": ["code-edit", "dialogue"], "n": 4, "max_tokens": 96, "drafter": NGRAM.name, "gamma": 4,
    "quant_drafters": "ngram:2,ngram:4,suffix:2,suffix:4",
    "static_gammas": [1, 2, 4, 6, 8], "policies": ["heuristic", "ema", "batch", "goodput"],
    "concurrencies": [1, 2, 4, 8, 16, 32], "serving_drafters": "ngram:4,suffix:4,ngram:goodput",
    "serving_max_tokens": 48, "repeats": 3, "contexts": [1024, 4096], "context_to_limit": True,
    "context_concurrencies": [1, 4, 16], "context_sources": ["xsum", "agent", "padding"],
}


def run_side_experiments(engine: TargetEngine, run_dir: Path, seed: int, progress: Any, warn: Any,
                         settings: SideExperimentSettingsDict | None = None) -> list[str]:
    """Quantization four-way, γ policies and serving (concurrency, context up to the model's limit)
    into ``run_dir``; an experiment whose JSON is already there is skipped (``--resume``), one that
    an interrupted run left half-written is skipped with a warning. Returns the experiments run."""
    from specledger.bench.experiment import check_fresh
    from specledger.bench.policies import POLICY_EXPERIMENT, run_policies
    from specledger.bench.quantization import QUANT_EXPERIMENT, float_engine, prompts_per_category, run_quantization
    from specledger.bench.serving import SERVING_EXPERIMENT, run_serving
    from specledger.rundir import POLICIES_JSON, QUANT_JSON, SERVING_JSON

    cfg: SideExperimentSettingsDict = {**FULL_SIDE_EXPERIMENTS, **(settings or {})}
    items, warnings = load_sweep_items(cfg["categories"], cfg["n"], seed, None, engine.model.config.vocab_size)
    for w in warnings:
        warn(w)
    contexts = list(cfg["contexts"])
    if cfg.get("context_to_limit"):
        contexts.append(min(engine.max_context, engine.model.config.max_seq_len) - cfg["serving_max_tokens"] - 64)
    common = dict(max_tokens=cfg["max_tokens"], out_dir=run_dir, seed=seed, progress=progress)
    candidates = parse_quant_candidates(cfg["quant_drafters"])

    def quant_items() -> list:  # its drafters are picked on prompts of their own (prompts_per_category)
        per_category = prompts_per_category(cfg["n"], candidates)
        if per_category == cfg["n"]:
            return items
        return load_sweep_items(cfg["categories"], per_category, seed, None, engine.model.config.vocab_size)[0]

    jobs = [
        (QUANT_EXPERIMENT, QUANT_JSON,
         lambda: run_quantization(float_engine(engine), quant_items(), candidates=candidates, **common)),
        (POLICY_EXPERIMENT, POLICIES_JSON,
         lambda: run_policies(engine, items, drafter=cfg["drafter"], static_gammas=cfg["static_gammas"],
                              policies=cfg["policies"], **common)),
        (SERVING_EXPERIMENT, SERVING_JSON,
         lambda: run_serving(engine, items, drafters=parse_drafter_gammas(cfg["serving_drafters"]),
                             concurrencies=cfg["concurrencies"], context_lengths=sorted(set(contexts)),
                             max_tokens=cfg["serving_max_tokens"], out_dir=run_dir, seed=seed, progress=progress,
                             repeats=cfg["repeats"], context_concurrencies=cfg["context_concurrencies"],
                             context_sources=cfg["context_sources"])),
    ]
    ran = []
    for name, json_name, job in jobs:
        if (run_dir / json_name).exists():
            continue
        try:
            check_fresh(run_dir, name)
        except SpecLedgerError:
            warn(f"{run_dir} holds part of an interrupted {name!r} experiment; skipped it -- run "
                 f"`specledger sweep --experiment {name} --out NEW_DIR` to measure it again")
            continue
        job()
        ran.append(name)
    return ran
