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
from typing import Any

from specledger.gates.engine_configs import DrafterDetails, engine_configs, pick_drafter


def _setting(v: dict[str, Any]) -> str:
    if v.get("decision") != "deploy":
        return "off"
    return f"{v['drafter']} γ={v.get('gamma')}" if v.get("drafter") else str(v.get("setting"))


def _load(v: dict[str, Any]) -> int:
    return int(v.get("load") or 1)


def decisions(cells: Sequence[dict[str, Any]], deployed: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """The per-load decisions as keys, load-sorted: ``load``, ``decision`` (the verdict's), ``setting``
    ("ngram γ=4" or "off"), ``drafter`` and ``gamma`` (None when not deployed), ``simulated`` and
    ``engine_gamma`` (the k the engine configs run there: 0 where off or another drafter decided)."""
    return [{"load": _load(v), "decision": v.get("decision"), "setting": _setting(v),
             "drafter": v.get("drafter") if v.get("decision") == "deploy" else None,
             "gamma": v.get("gamma") if v.get("decision") == "deploy" else None,
             "simulated": bool(v.get("simulated")), "engine_gamma": (deployed or {}).get(_load(v), 0)}
            for v in cells]


def schedules(verdicts: Sequence[dict[str, Any]], target_load: int | None = None,
              llama_flags: frozenset[str] | None = None) -> list[dict[str, Any]]:
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
                                 "llama_cpp": None, "ranges": None, "note": "", "configs_note": "",
                                 "drafter": None, "gamma": 0, "decisions": decisions(cells), "versions": None,
                                 "crossovers": [] if control else crossovers(cells)}
        if not control:
            budget = max((int(v.get("tree_budget") or 0) for v in cells if v.get("drafter") == drafter), default=0)
            cfg = engine_configs(plan, drafter=drafter, details=DrafterDetails(tree_budget=budget),
                                 llama_flags=llama_flags)
            switched = sorted({v["drafter"] for v in cells if plan[_load(v)] and v["drafter"] != drafter})
            entry.update({k: cfg[k] for k in ("vllm", "trtllm", "sglang", "llama_cpp", "ranges", "versions")},
                         drafter=cfg["drafter"] if cfg["gamma"] else None, gamma=cfg["gamma"],
                         decisions=decisions(cells, cfg["gamma_by_load"]),
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


def switches(cells: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Where the setting changes between two measured (or simulated) loads with loads between them that
    nothing measured: (a, b), the last load of one setting and the first of the next (cells sorted by load)."""
    out = []
    for v, w in zip(cells, cells[1:]):
        a, b = _load(v), _load(w)
        if _setting(v) != _setting(w) and b > a + 1:
            out.append((a, b))
    return out


def crossovers(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every change of setting between adjacent loads (cells sorted by load), as keys: ``between`` [a, b] (the
    loads around it), ``from`` / ``to`` (the settings), ``located`` (b <= 2·a), ``configs_switch_at`` (a + 1, the
    engine configs' rule) and ``simulated`` (either side simulated)."""
    from specledger.load_bisect import is_located

    return [{"between": [_load(v), _load(w)], "from": _setting(v), "to": _setting(w),
             "located": is_located(_load(v), _load(w)), "configs_switch_at": _load(v) + 1,
             "simulated": bool(v.get("simulated") or w.get("simulated"))}
            for v, w in zip(cells, cells[1:]) if _setting(v) != _setting(w)]


def switch_text(cells: Sequence[dict[str, Any]]) -> str:
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


def schedule_text(cells: Sequence[dict[str, Any]]) -> str:
    """"ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim)": runs of equal settings merged (cells
    sorted by load), loads the simulator decided marked "(sim)"; then where each change lies between the loads
    measured and where the configs switch (:func:`switch_text`)."""
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    for v in cells:
        s = _setting(v)
        if runs and runs[-1][0] == s:
            runs[-1][1].append(v)
        else:
            runs.append((s, [v]))
    text = ", ".join(_run_text(s, vs, i == len(runs) - 1, len(runs) == 1) for i, (s, vs) in enumerate(runs))
    return text + switch_text(cells)


def snippet(schedule: dict[str, Any], kind: str) -> str:
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
