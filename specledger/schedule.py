"""The verdict as a schedule: per (category, temperature), load (concurrency) -> setting.

The decision at each load comes from :func:`specledger.gates.verdicts` run on that load's
scenarios (entries carry ``load`` and ``simulated``). This module folds them into one line per
category ("ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64") and emits it paste-ready:

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


def schedule_text(cells: Sequence[dict[str, Any]]) -> str:
    """"ngram γ=4 at 1–4, ngram γ=2 at 16, off from 64" (runs of equal settings merged; ``*`` = simulated)."""
    runs: list[list[Any]] = []
    for v in cells:
        load = int(v.get("load") or 1)
        mark = "*" if v.get("simulated") else ""
        s = _setting(v)
        if runs and runs[-1][0] == s:
            runs[-1][2] = f"{load}{mark}"
        else:
            runs.append([s, f"{load}{mark}", f"{load}{mark}"])
    parts = []
    for i, (s, lo, hi) in enumerate(runs):
        last = i == len(runs) - 1
        if s == "off" and last and len(runs) > 1:
            parts.append(f"off from {lo}")
        else:
            parts.append(f"{s} at {lo}" if lo == hi else f"{s} at {lo}–{hi}")
    return ", ".join(parts)


def snippet(schedule: dict[str, Any], kind: str) -> str:
    """The paste-ready text of ``schedule["vllm"]`` (``kind="vllm"``) or ``["trtllm"]`` (JSON)."""
    body = schedule.get(kind)
    return json.dumps(body, ensure_ascii=False) if body else "# no speculative setting to deploy"
