"""The verdict as a schedule: per (category, temperature), load (concurrency) -> setting.

The decision at each load comes from :func:`specledger.gates.verdicts` run on that load's
scenarios (entries carry ``load`` and ``simulated``). This module folds them into one line per
category ("ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64 (sim)"; "(sim)": decided by the
simulator, :mod:`specledger.simulated_loads`) and emits it paste-ready:

- vLLM-style: ``speculative_config`` with ``num_speculative_tokens`` (the largest γ used) and
  ``num_speculative_tokens_per_batch_size`` (batch size -> γ, 0 = off);
- TensorRT-LLM-style: ``draft_len_schedule`` (batch size -> draft length, 0 = off).

Both engines take one drafter per deployment: when the schedule switches drafter across loads,
the snippet keeps the drafter of the target load (or the lowest load) and says so.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

#: specledger drafter -> vLLM speculative method name
VLLM_METHOD = {"ngram": "ngram", "suffix": "suffix", "model": "draft_model", "layerskip": "layerskip",
               "quant-self": "draft_model"}


def _setting(v: dict[str, Any]) -> str:
    return f"{v['drafter']} γ={v['gamma']}" if v.get("decision") == "deploy" else "off"


def schedules(verdicts: Sequence[dict[str, Any]], target_load: int | None = None) -> list[dict[str, Any]]:
    """One schedule per (category, temperature): ``cells`` (load-sorted verdict entries), ``text``,
    ``vllm`` and ``trtllm`` (dicts), ``at_target`` (the entry at ``target_load``, if given)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        groups[(v["category"], v["temperature"])].append(v)
    out = []
    for (cat, temp), cells in groups.items():
        cells = sorted(cells, key=lambda v: int(v.get("load") or 1))
        control = any(v.get("decision") == "control" for v in cells)
        anchor = next((v for v in cells if target_load is not None and int(v.get("load") or 1) == target_load),
                      None)
        deployed = [v for v in cells if v.get("decision") == "deploy"]
        drafter = (anchor if anchor and anchor.get("decision") == "deploy" else (deployed[0] if deployed else {})
                   ).get("drafter")
        per_bs = {int(v.get("load") or 1): (int(v["gamma"]) if v.get("decision") == "deploy"
                                            and v.get("drafter") == drafter and isinstance(v.get("gamma"), int)
                                            else 0) for v in cells}
        switched = sorted({v["drafter"] for v in deployed} - {drafter})
        note = (f"the schedule also uses {', '.join(switched)} at some loads; one drafter per deployment, "
                f"so those loads are off here" if switched else "")
        vllm = ({"speculative_config": {"method": VLLM_METHOD.get(drafter, drafter),
                                        "num_speculative_tokens": max(per_bs.values()),
                                        "num_speculative_tokens_per_batch_size": per_bs}}
                if drafter and not control else None)
        trt = {"draft_len_schedule": per_bs} if drafter and not control else None
        out.append({"category": cat, "temperature": temp, "cells": cells, "control": control,
                    "text": "control, never deployed" if control else schedule_text(cells),
                    "at_target": anchor, "vllm": vllm, "trtllm": trt, "note": note})
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
    """The paste-ready text of ``schedule["vllm"]`` (``kind="vllm"``) or ``["trtllm"]`` (JSON)."""
    body = schedule.get(kind)
    return json.dumps(body, ensure_ascii=False) if body else "# no speculative setting to deploy"
