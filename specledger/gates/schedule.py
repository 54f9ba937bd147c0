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
import shlex
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, TypedDict

from specledger.gates.decision import Verdict, VerdictDict, as_verdict
from specledger.gates.engine_configs import DrafterDetails, engine_configs, pick_drafter

#: a verdict cell as given: the object, or its dict form (``summary.json``, hand-built)
Cell = Verdict | VerdictDict


class ScheduleDecision(TypedDict):
    """One load's decision in a schedule (:func:`decisions`)."""

    load: int
    decision: str  # the verdict's
    setting: str  # "ngram γ=4", or "off" where it does not deploy
    drafter: str | None  # None where it does not deploy
    gamma: int | str | None  # None where it does not deploy
    simulated: bool
    engine_gamma: int  # the k the engine configs run there: 0 where off or another drafter decided


#: a change of setting between adjacent loads (:func:`crossovers`); "from" is a keyword, hence this form
Crossover = TypedDict("Crossover", {
    "between": list[int],  # [a, b]: the loads around it
    "from": str, "to": str,  # the settings
    "located": bool,  # b <= 2·a
    "configs_switch_at": int,  # a + 1: the engine configs' rule
    "simulated": bool,  # either side simulated
})


class LoadSchedule(TypedDict):
    """One (category, temperature)'s decisions over the loads, as a schedule (:func:`schedules`)."""

    category: str
    temperature: float
    cells: list[Cell]  # the verdicts, load-sorted
    control: bool  # a control category: never deployed
    text: str  # :func:`schedule_text`
    at_target: Cell | None  # the verdict at the target load
    vllm: dict[str, Any] | None  # the engines' own config documents (engine_configs): None where not runnable
    trtllm: dict[str, Any] | None
    sglang: list[str] | None  # launch flags
    llama_cpp: list[str] | None
    ranges: list[list[int]] | None  # [[start, end, γ]]
    note: str  # another drafter at some loads
    configs_note: str  # the engines' notes
    drafter: str | None  # the deployment's one drafter (None when off)
    gamma: int  # the draft length a one-γ server runs (0 when off)
    decisions: list[ScheduleDecision]
    versions: dict[str, str] | None  # engine -> the version each config's schema follows
    crossovers: list[Crossover]


def _setting(v: Verdict) -> str:
    if not v.deploys:
        return "off"
    return f"{v.drafter} γ={v.gamma}" if v.drafter else str(v.setting)


def decisions(cells: Sequence[Cell], deployed: dict[int, int] | None = None) -> list[ScheduleDecision]:
    """The per-load decisions as keys, load-sorted: ``load``, ``decision`` (the verdict's), ``setting``
    ("ngram γ=4" or "off"), ``drafter`` and ``gamma`` (None when not deployed), ``simulated`` and
    ``engine_gamma`` (the k the engine configs run there: 0 where off or another drafter decided)."""
    return [{"load": v.load_or_solo, "decision": v.decision, "setting": _setting(v),
             "drafter": v.drafter if v.deploys else None, "gamma": v.gamma if v.deploys else None,
             "simulated": bool(v.simulated), "engine_gamma": (deployed or {}).get(v.load_or_solo, 0)}
            for v in map(as_verdict, cells)]


def schedules(verdicts: Sequence[Cell], target_load: int | None = None,
              llama_flags: frozenset[str] | None = None) -> list[LoadSchedule]:
    """One schedule per (category, temperature): ``cells`` (load-sorted verdict entries), ``text``,
    ``at_target`` (the entry at ``target_load``, if given), ``drafter`` / ``gamma`` (the deployment's one
    drafter and the draft length a one-γ server runs; None / 0 when off), ``decisions`` (:func:`decisions`),
    the engine snippets ``vllm`` (the ``--speculative-config`` value), ``trtllm``
    (``{"speculative_config": ...}``), ``sglang``, ``llama_cpp`` (argv lists), each None where that
    engine cannot run the schedule, ``ranges`` ([[start, end, γ]]), ``crossovers`` (:func:`crossovers`: where
    the setting changes along the load), ``versions`` (the engine version
    each config's schema follows), ``note`` (another drafter at some loads) and ``configs_note`` (the
    engines' notes: what is missing, what to replace). ``llama_flags``: what the llama-server at hand
    offers (:func:`specledger.gates.engine_configs.engine_configs`)."""
    groups: dict[tuple[str, float], list[tuple[Verdict, Cell]]] = defaultdict(list)
    for cell in verdicts:
        v = as_verdict(cell)
        groups[(v.category, v.temperature)].append((v, cell))
    out = []
    for (cat, temp), pairs in groups.items():
        pairs = sorted(pairs, key=lambda p: p[0].load_or_solo)
        typed, cells = [v for v, _ in pairs], [c for _, c in pairs]
        control = any(v.is_control for v in typed)
        anchor = next((c for v, c in pairs if target_load is not None and v.load_or_solo == target_load), None)
        plan = {v.load_or_solo: ((v.drafter, v.gamma) if v.deploys and v.drafter else None) for v in typed}
        drafter = pick_drafter(plan, target_load)
        entry: LoadSchedule = {"category": cat, "temperature": temp, "cells": cells, "control": control,
                               "text": "control, never deployed" if control else schedule_text(typed),
                               "at_target": anchor, "vllm": None, "trtllm": None, "sglang": None,
                               "llama_cpp": None, "ranges": None, "note": "", "configs_note": "",
                               "drafter": None, "gamma": 0, "decisions": decisions(typed), "versions": None,
                               "crossovers": [] if control else crossovers(typed)}
        if not control:
            # a verdict names no tree budget (its ``setting`` text does): the configs are for chains
            cfg = engine_configs(plan, drafter=drafter, details=DrafterDetails(tree_budget=0),
                                 llama_flags=llama_flags)
            switched = sorted({v.drafter for v in typed if plan[v.load_or_solo] and v.drafter != drafter})
            entry.update({k: cfg[k] for k in ("vllm", "trtllm", "sglang", "llama_cpp", "ranges", "versions")},
                         drafter=cfg["drafter"] if cfg["gamma"] else None, gamma=cfg["gamma"],
                         decisions=decisions(typed, cfg["gamma_by_load"]),
                         configs_note=cfg["note"],
                         note=(f"the schedule also uses {', '.join(switched)} at some loads; one drafter per "
                               f"deployment, so those loads are off here" if switched else ""))
        out.append(entry)
    return out


def _span(loads: Sequence[int]) -> str:
    return f"{loads[0]}" if len(loads) == 1 else f"{loads[0]}–{loads[-1]}"


def _run_text(setting: str, cells: Sequence[Verdict], last: bool, alone: bool) -> str:
    """One run of equal settings: its measured loads, then its simulated ones marked "(sim)"."""
    real = [v.load_or_solo for v in cells if not v.simulated]
    sim = [v.load_or_solo for v in cells if v.simulated]
    if setting == "off" and last and not alone:
        first = real[0] if real else sim[0]
        return f"off from {first}" + (" (sim)" if not real else f" (measured to {real[-1]}, simulated from {sim[0]})"
                                      if sim else "")
    parts = ([_span(real)] if real else []) + ([f"{_span(sim)} (sim)"] if sim else [])
    return f"{setting} at {' and '.join(parts)}"


def switches(cells: Sequence[Cell]) -> list[tuple[int, int]]:
    """Where the setting changes between two measured (or simulated) loads with loads between them that
    nothing measured: (a, b), the last load of one setting and the first of the next (cells sorted by load)."""
    typed = [as_verdict(c) for c in cells]
    out = []
    for v, w in zip(typed, typed[1:]):
        a, b = v.load_or_solo, w.load_or_solo
        if _setting(v) != _setting(w) and b > a + 1:
            out.append((a, b))
    return out


def crossovers(cells: Sequence[Cell]) -> list[Crossover]:
    """Every change of setting between adjacent loads (cells sorted by load), as keys: ``between`` [a, b] (the
    loads around it), ``from`` / ``to`` (the settings), ``located`` (b <= 2·a), ``configs_switch_at`` (a + 1, the
    engine configs' rule) and ``simulated`` (either side simulated)."""
    from specledger.load_bisect import is_located

    typed = [as_verdict(c) for c in cells]
    return [{"between": [v.load_or_solo, w.load_or_solo], "from": _setting(v), "to": _setting(w),
             "located": is_located(v.load_or_solo, w.load_or_solo), "configs_switch_at": v.load_or_solo + 1,
             "simulated": bool(v.simulated or w.simulated)}
            for v, w in zip(typed, typed[1:]) if _setting(v) != _setting(w)]


def switch_text(cells: Sequence[Cell]) -> str:
    """" (between 4 and 8: configs switch at 5)": where each change was bracketed, whether within 2×
    (:func:`specledger.load_bisect.is_located`; otherwise "not located within 2×"), and the batch size where
    the configs switch: the engine configs' rule (:mod:`specledger.gates.engine_configs`: a measured load decides
    the batch sizes down to the load below it) places the switch just above the last load of the earlier
    setting. "" where every change is between adjacent loads."""
    from specledger.load_bisect import is_located

    found = switches(cells)
    if not found:
        return ""
    parts = [f"between {a} and {b}" + ("" if is_located(a, b) else ", not located within 2×")
             + (": configs switch at " if i == 0 else ": at ") + str(a + 1) for i, (a, b) in enumerate(found)]
    return f" ({'; '.join(parts)})"


def schedule_text(cells: Sequence[Cell]) -> str:
    """"ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim)": runs of equal settings merged (cells
    sorted by load), loads the simulator decided marked "(sim)"; then where each change lies between the loads
    measured and where the configs switch (:func:`switch_text`)."""
    runs: list[tuple[str, list[Verdict]]] = []
    for v in map(as_verdict, cells):
        s = _setting(v)
        if runs and runs[-1][0] == s:
            runs[-1][1].append(v)
        else:
            runs.append((s, [v]))
    text = ", ".join(_run_text(s, vs, i == len(runs) - 1, len(runs) == 1) for i, (s, vs) in enumerate(runs))
    return text + switch_text(cells)


def snippet(schedule: LoadSchedule, kind: str) -> str:
    """The paste-ready text of ``schedule[kind]``: ``--speculative-config '<JSON>'`` for ``"vllm"`` (the
    ``vllm serve`` argument), JSON for ``"trtllm"`` (its ``--extra_llm_api_options`` content), the flags
    joined for ``"sglang"`` / ``"llama_cpp"``; a comment where there is nothing to deploy."""
    body = schedule.get(kind)
    if not body:
        return "# no speculative setting to deploy"
    if isinstance(body, list):
        return shlex.join(body)
    text = json.dumps(body, ensure_ascii=False)
    return f"--speculative-config {shlex.quote(text)}" if kind == "vllm" else text
