"""The schedules of a ``probe --launch`` report in the launched engine's own terms: each schedule's engine
snippet becomes the measured configuration's command (with the engine's concurrency cap where speculation
pays at the lowest loads only); the other engines' snippets are dropped. The summary builder calls
:func:`patch_launched_schedules`; this module imports nothing of the report."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from specledger.gates.decision import Verdict, as_verdict
from specledger.probe.engine_command import BASELINE_SPEC, Spec, engine_argv, spec_drafter_label

#: the flag that caps concurrency, per engine (the schedule's "serve plainly above" advice)
CONCURRENCY_FLAG = {"llama.cpp": "--parallel", "vllm": "--max-num-seqs", "sglang": "--max-running-requests"}
#: every spelling of those flags (an existing one is replaced, not repeated)
CONCURRENCY_ALIASES = {"--parallel": ("--parallel", "-np"), "--max-num-seqs": ("--max-num-seqs",),
                       "--max-running-requests": ("--max-running-requests",)}


def _on_loads(cells: Sequence[Verdict], label: str) -> list[int]:
    return sorted(v.load_or_solo for v in cells if v.deploys and v.drafter == label)


def engine_flags(template: str, spec: Spec, kind: str, on_loads: Sequence[int], loads: Sequence[int]
                 ) -> tuple[list[str], str]:
    """(the engine command to deploy ``spec``, a note): ``{spec}`` filled with its measured arguments,
    ``{port}`` as ``PORT``; when it pays at the lowest loads only, the engine's concurrency cap
    (:data:`CONCURRENCY_FLAG`) at the largest load of that run."""
    argv = engine_argv(template, "PORT", spec)
    measured = sorted(set(loads))
    cap = 0
    for load in measured:
        if load not in on_loads:
            break
        cap = load
    flag = CONCURRENCY_FLAG.get(kind)
    shown = ", ".join(map(str, measured))
    if cap and cap < measured[-1] and flag:
        note = (f"pays at loads up to {cap} of those measured ({shown}): {flag} {cap} keeps the engine there; serve "
                "more traffic from a plain server")
        return with_flag(argv, CONCURRENCY_ALIASES.get(flag, (flag,)), str(cap)), note
    if cap and cap == measured[-1]:
        return argv, f"pays at every measured load ({shown}); above {cap} it was not measured"
    if cap:  # pays at the lowest loads, and this engine has no concurrency cap we know of
        return argv, f"pays at loads up to {cap} of those measured ({shown}); cap this engine's concurrency there"
    return argv, f"on at loads {', '.join(map(str, on_loads))} only, off at load {measured[0]}: one server cannot " \
                 "switch by load; run it only where the load stays there"


def with_flag(argv: Sequence[str], names: Sequence[str], value: str) -> list[str]:
    """``argv`` with the flag ``names[0]`` set to ``value``: an existing value of any of its spellings
    (``-np 4``, ``--parallel=4``) replaced, else the flag appended."""
    out, found = list(argv), False
    for i, word in enumerate(out):
        if word in names and i + 1 < len(out):
            out[i + 1], found = value, True
        elif any(word.startswith(n + "=") for n in names if n.startswith("--")):
            out[i], found = f"{word.split('=', 1)[0]}={value}", True
    return out if found else out + [names[0], value]


def patch_schedules(summary: dict[str, Any], template: str, specs: Sequence[Spec], kind: str,
                    loads: Sequence[int]) -> None:
    """In place: each schedule's engine snippets become the launched engine's command (``engine_flags``,
    under ``engine``), the other engines' are dropped (they were not what ran)."""
    by_label = {spec_drafter_label(s, kind): s for s in specs}
    for sch in summary.get("schedules") or []:
        cells = [as_verdict(v) for v in summary.get("verdicts") or []
                 if v.get("category") == sch.get("category") and v.get("temperature") == sch.get("temperature")]
        deployed = [v.drafter for v in cells if v.deploys]
        label = max(sorted(set(deployed)), key=deployed.count) if deployed else None  # ties: by name, reproducible
        for key in ("vllm", "trtllm", "sglang", "llama_cpp"):
            sch[key] = None
        sch["configs_note"] = ""
        if label in by_label:
            argv, note = engine_flags(template, by_label[label], kind, _on_loads(cells, label), loads)
            sch["engine"] = {"kind": kind, "spec": by_label[label].name, "argv": argv, "command": shlex.join(argv),
                             "note": note}
        else:
            sch["engine"] = {"kind": kind, "spec": BASELINE_SPEC, "argv": None, "command": None,
                             "note": "speculation pays at no measured load: serve with --spec off's command"}


def patch_launched_schedules(summary: dict[str, Any], launch: Mapping[str, Any], loads: Sequence[int]) -> None:
    """:func:`patch_schedules` from what run.json's ``launch`` records (the summary builder calls it, so a
    report rebuilt with ``specledger report`` keeps the engine's own command)."""
    specs = [Spec(str(name), tuple(d.get("args") or ())) for name, d in (launch.get("specs") or {}).items()]
    patch_schedules(summary, str(launch.get("command") or ""), specs, str(launch.get("engine") or "engine"), loads)
