"""The verdict as a schedule: per (category, temperature), load (concurrency) -> setting.

The decision at each load comes from :func:`specledger.gates.verdicts` run on that load's
scenarios (entries carry ``load`` and ``simulated``). This module folds them into one line per
category ("ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim)"; "(sim)": decided by the
simulator, :mod:`specledger.gates.simulated_loads`) and hands the per-load settings to
:func:`specledger.gates.engine_configs.engine_configs`, the one writer of the engine snippets (vLLM
``speculative_config`` with ``num_speculative_tokens_per_batch_size`` ranges, TensorRT-LLM
``draft_len_schedule``, SGLang and llama.cpp launch flags; its docstring states the rule for loads
between measured points and what each engine enforces).

A load counts as on only when its verdict's ``decision`` is ``"deploy"``; every other decision
("off", "no-decision", anything new) is off (γ 0) there. One drafter per deployment: the snippets
keep the drafter of the target load (or the lowest deploying load) and say which loads another
drafter decided.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from specledger.gates.engine_configs import DrafterDetails, engine_configs, pick_drafter


def _setting(v: dict[str, Any]) -> str:
    return f"{v['drafter']} γ={v['gamma']}" if v.get("decision") == "deploy" else "off"


def _load(v: dict[str, Any]) -> int:
    return int(v.get("load") or 1)


def schedules(verdicts: Sequence[dict[str, Any]], target_load: int | None = None) -> list[dict[str, Any]]:
    """One schedule per (category, temperature): ``cells`` (load-sorted verdict entries), ``text``,
    ``at_target`` (the entry at ``target_load``, if given), the engine snippets ``vllm``, ``trtllm``
    (``{"speculative_config": ...}``), ``sglang``, ``llama_cpp`` (argv lists), each None where that
    engine cannot run the schedule, ``ranges`` ([[start, end, γ]]), ``note`` (another drafter at
    some loads) and ``configs_note`` (the engines' notes: what is missing, what to replace)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        groups[(v["category"], v["temperature"])].append(v)
    out = []
    for (cat, temp), cells in groups.items():
        cells = sorted(cells, key=_load)
        control = any(v.get("decision") == "control" for v in cells)
        anchor = next((v for v in cells if target_load is not None and _load(v) == target_load), None)
        plan = {_load(v): ((v["drafter"], v["gamma"]) if v.get("decision") == "deploy" and v.get("drafter")
                           else None) for v in cells}
        drafter = pick_drafter(plan, target_load)
        entry: dict[str, Any] = {"category": cat, "temperature": temp, "cells": cells, "control": control,
                                 "text": "control, never deployed" if control else schedule_text(cells),
                                 "at_target": anchor, "vllm": None, "trtllm": None, "sglang": None,
                                 "llama_cpp": None, "ranges": None, "note": "", "configs_note": ""}
        if not control:
            budget = max((int(v.get("tree_budget") or 0) for v in cells if v.get("drafter") == drafter), default=0)
            cfg = engine_configs(plan, drafter=drafter, details=DrafterDetails(tree_budget=budget))
            switched = sorted({v["drafter"] for v in cells if plan[_load(v)] and v["drafter"] != drafter})
            entry.update({k: cfg[k] for k in ("vllm", "trtllm", "sglang", "llama_cpp", "ranges")},
                         configs_note=cfg["note"],
                         note=(f"the schedule also uses {', '.join(switched)} at some loads; one drafter per "
                               f"deployment, so those loads are off here" if switched else ""))
        out.append(entry)
    return out


def _span(loads: Sequence[int]) -> str:
    return f"{loads[0]}" if len(loads) == 1 else f"{loads[0]}–{loads[-1]}"


def _run_text(setting: str, cells: Sequence[dict[str, Any]], last: bool, alone: bool) -> str:
    """One run of equal settings: its measured loads, then its simulated ones marked "(sim)"."""
    real = [int(v.get("load") or 1) for v in cells if not v.get("simulated")]
    sim = [int(v.get("load") or 1) for v in cells if v.get("simulated")]
    if setting == "off" and last and not alone:
        first = real[0] if real else sim[0]
        return f"off from {first}" + (" (sim)" if not real else f" (measured to {real[-1]}, simulated from {sim[0]})"
                                      if sim else "")
    parts = ([_span(real)] if real else []) + ([f"{_span(sim)} (sim)"] if sim else [])
    return f"{setting} at {' and '.join(parts)}"


def schedule_text(cells: Sequence[dict[str, Any]]) -> str:
    """"ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim)": runs of equal settings merged (cells
    sorted by load), loads the simulator decided marked "(sim)"."""
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    for v in cells:
        s = _setting(v)
        if runs and runs[-1][0] == s:
            runs[-1][1].append(v)
        else:
            runs.append((s, [v]))
    return ", ".join(_run_text(s, vs, i == len(runs) - 1, len(runs) == 1) for i, (s, vs) in enumerate(runs))


def snippet(schedule: dict[str, Any], kind: str) -> str:
    """The paste-ready text of ``schedule[kind]``: JSON for ``"vllm"`` / ``"trtllm"``, the flags
    joined for ``"sglang"`` / ``"llama_cpp"``; a comment where there is nothing to deploy."""
    body = schedule.get(kind)
    if not body:
        return "# no speculative setting to deploy"
    return " ".join(body) if isinstance(body, list) else json.dumps(body, ensure_ascii=False)
