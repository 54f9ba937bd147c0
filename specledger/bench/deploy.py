"""Deploy tables from the serving experiment's curves.

Per load level, the fastest setting if its speed-up over plain at that load is > 1, else "off";
for the best drafter overall a {concurrency: γ or 0} schedule, whose engine configs (vLLM
``num_speculative_tokens_per_batch_size`` ranges, TensorRT-LLM ``draft_len_schedule``, SGLang and
llama.cpp flags) come from :mod:`specledger.gates.engine_configs`, the one writer of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specledger.bench.serving_metrics import context_position, load_group, setting_label
from specledger.bench.serving_types import DeployConfigsDict, DeployRowDict, ServingPointDict, ServingSweepDict
from specledger.engine.drafters.catalog import PLAIN
from specledger.gates.engine_configs import batch_ranges, engine_configs


def deploy_table(result: ServingSweepDict) -> list[DeployRowDict]:
    """Per load level (every concurrency, rate and context point): the setting with the highest
    throughput if its speed-up over plain at that load is > 1 -- and, with repeats, the lower end
    of its 95% interval too -- else "off" (plain decoding)."""
    rows: list[DeployRowDict] = []
    for kind in ("concurrency", "rate", "context"):
        loads: dict[tuple, list[ServingPointDict]] = {}
        for p in result.get(kind, []):
            loads.setdefault(load_group(p), []).append(p)
        for group, pts in loads.items():
            load = group[1]
            spec = [p for p in pts if p["drafter"] != PLAIN.name and p.get("speedup") is not None]
            best = max(spec, key=lambda p: p["throughput_tok_s"], default=None)
            ci = best.get("speedup_ci") if best is not None else None
            on = best is not None and best["speedup"] > 1.0 and (ci is None or ci[0] > 1.0)
            rows.append({
                "kind": kind,
                "load": load,
                **context_position(pts[0]),
                "decision": "deploy" if on else "off",
                "drafter": best["drafter"] if on else None,
                "gamma": best["gamma"] if on else 0,
                "setting": best["setting"] if on else "off",
                "speedup": best["speedup"] if best else None,
                "speedup_ci": ci,
                "best_candidate": best["setting"] if best else None,
                "throughput_tok_s": best["throughput_tok_s"] if on else
                next((p["throughput_tok_s"] for p in pts if p["drafter"] == PLAIN.name), None),
            })
    return rows


def best_overall(points: Sequence[ServingPointDict]) -> tuple[str, int] | None:
    """The (drafter, gamma) with the highest geometric-mean speed-up over the given points."""
    by: dict[tuple[str, int], list[float]] = {}
    for p in points:
        if p["drafter"] != PLAIN.name and isinstance(p["gamma"], int) and p.get("speedup"):  # static gammas only:
            by.setdefault((p["drafter"], p["gamma"]), []).append(p["speedup"])  # a config needs a number
    if not by:
        return None
    return max(by, key=lambda k: math.fsum(math.log(s) for s in by[k]) / len(by[k]))


def gamma_by_concurrency(points: Sequence[ServingPointDict], drafter: str, gamma: int) -> dict[int, int]:
    """{concurrency: gamma if this drafter's speed-up there is > 1 else 0} (a batch-size schedule)."""
    return {int(p["load"]): (gamma if p.get("speedup") is not None and p["speedup"] > 1.0 else 0)
            for p in sorted(points, key=lambda p: p["load"]) if p["drafter"] == drafter and p["gamma"] == gamma}


def batch_size_ranges(schedule: dict[int, int]) -> list[list[int]]:
    """{c_i: K_i} -> [[start, end, K], ...] (:func:`specledger.gates.engine_configs.batch_ranges`):
    each measured c_i covers (c_(i-1), c_i] -- decided by the measurement at its largest batch, the
    conservative end when speed-up falls with load -- and batches above the largest measured one
    get K = 0 (untested: plain), up to 1024 or past the largest load; equal neighbours merged."""
    return batch_ranges(schedule) if schedule else []


def deploy_configs(result: ServingSweepDict) -> DeployConfigsDict:
    """Paste-ready settings for the best drafter overall (:func:`best_overall` over the concurrency
    points): its {concurrency: gamma or 0} schedule and every engine's config from
    :func:`specledger.gates.engine_configs.engine_configs` (``vllm`` keeps its ``note``; ``trtllm``,
    ``sglang``, ``llama_cpp`` are None where the engine cannot run it; ``configs_note`` says why) and
    an SGLang note. JSON turns the schedule's integer keys into strings."""
    conc = result.get("concurrency", [])
    best = best_overall(conc)
    out: DeployConfigsDict = {"best_drafter": None, "gamma": None, "gamma_by_concurrency": {}, "vllm": None,
                              "trtllm": None, "sglang": None, "llama_cpp": None, "sglang_note": "",
                              "configs_note": ""}
    if best is None:
        return out
    drafter, gamma = best
    schedule = gamma_by_concurrency(conc, drafter, gamma)
    crossover_at = result.get("crossover", {}).get("concurrency", {}).get(setting_label(drafter, gamma))
    out.update({"best_drafter": drafter, "gamma": gamma, "gamma_by_concurrency": schedule})
    on = [c for c, k in schedule.items() if k]
    launch = "SGLang fixes the draft length per server at launch (--speculative-num-steps / " \
             "--speculative-num-draft-tokens). "
    if not on:
        out["vllm"] = {"speculative_config": None, "note": f"{setting_label(drafter, gamma)} never beat plain "
                       "decoding here: leave speculation off."}
        out["sglang_note"] = launch + "No measured load favoured speculation: launch without it."
        return out
    cfg = engine_configs({c: (drafter, k) if k else None for c, k in schedule.items()}, drafter=drafter)
    out.update({k: cfg[k] for k in ("trtllm", "sglang", "llama_cpp")}, configs_note=cfg["note"])
    vllm = cfg["vllm"]  # the value of vllm serve --speculative-config
    out["vllm"] = {"speculative_config": vllm,
                   "note": ("vLLM dynamic speculative decoding: [start_bs, end_bs, K] ranges from the measured "
                            "concurrencies; K = 0 turns speculation off. Measured on this machine and model: "
                            "re-measure on the deployment hardware. " if vllm else "")
                   + cfg["notes"].get("vllm", "")}
    stop = (f"from a concurrency of {crossover_at}" if crossover_at is not None
            else f"above {max(schedule)} (the largest load measured)")
    out["sglang_note"] = launch + (
        f"To follow this table, speculate (γ={gamma}) only on instances whose running requests stay below "
        f"the crossover (cap --max-running-requests), and decode plainly {stop}.")
    return out
