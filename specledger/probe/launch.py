"""``specledger probe --launch CMD --spec NAME=ARGS ...``: start an engine once per speculative
configuration, probe it at every load with the same prompts, stop it, go on; then decide as the local path.

``CMD`` is the engine's command line with ``{port}`` (required: the port the launcher picks, or
``--launch-port``) and ``{spec}`` (a configuration's arguments; appended at the end when absent). Each
``--spec NAME=ARGS`` is one configuration; the one named ``off``
(:data:`~specledger.probe.engine_command.BASELINE_SPEC`) is plain decoding,
the baseline every other is compared with. Per configuration, in this order (:func:`run_order`: ``off``
first, then the others as given; with ``--repeats R`` the sequence R times, reversed every other time; every
server serves every load in ascending order):

1. the port must be free (a port already taken is a one-line error: something else would answer);
2. the engine starts with its log in ``OUT/launch/logs/NAME.log``
   (:class:`~specledger.probe.engine_server.EngineServer`), and must answer ``GET /health`` with 200 while
   its process lives (``--launch-timeout``);
3. :func:`specledger.probe.endpoint_loads.run_probe_loads` probes it at each load (``/metrics`` scraped around
   each load);
4. the process group is stopped (SIGTERM, then SIGKILL), and the configuration is saved as
   ``OUT/launch/NAME.json`` (reports and per-request results of every load).

A server that fails to start or exits during its run is a one-line error naming its log; the saved
configurations stay, and the same command resumes (``OUT/launch/plan.json`` must match: same command,
configurations, loads, prompts and sampling). When every configuration is in, the run folder is written
as ``probe --loads`` writes it (:mod:`specledger.probe.launch_dir`), with one drafter label per configuration,
and the report gives the four gates per (category, load), the verdicts and the schedule.

What the launched engine says is read as what it is:

* γ is the configured draft length (:func:`~specledger.probe.engine_command.configured_gamma`: llama.cpp the
  flag of the ``--spec-type``, e.g.
  ``--spec-ngram-simple-size-m`` or ``--spec-draft-n-max``, else the default the binary's ``--help`` states;
  vLLM ``num_speculative_tokens``, SGLang ``--speculative-num-steps``), never the deepest position the
  counters show; ``"unknown"`` when nothing says;
* m_KV (bytes of K and V per token) from the GGUF the command loads
  (:func:`~specledger.probe.model_file.gguf_kv_facts`:
  ``2 · block_count · head_count_kv · head_dim · bytes per element``, f16 unless ``-ctk`` / ``-ctv`` say);
* the per-request speculation figures are reconciled with the server's counter deltas per configuration
  (:func:`specledger.probe.counters.engine_counters`; ``engine_counters`` in run.json and summary.json);
* the paste-ready config is that engine's own arguments
  (:func:`~specledger.probe.launch_schedules.engine_flags`): the measured
  configuration's, with the engine's concurrency cap where the schedule turns speculation off above a
  load -- never another engine's config (the schedule's vLLM / TensorRT-LLM snippets are dropped).

The pieces: :mod:`~specledger.probe.engine_command` (the command line, γ, labels),
:mod:`~specledger.probe.engine_server` (one process and its port), :mod:`~specledger.probe.launch_runs` (a
configuration's loads and repeats), :mod:`~specledger.probe.model_file` (m_KV),
:mod:`~specledger.probe.launch_dir`
(the run folder), :mod:`~specledger.probe.launch_schedules` (the engine's own command in the schedules).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from specledger.errors import SpecLedgerError
from specledger.probe.endpoint_loads import run_probe_loads
from specledger.probe.engine_command import Spec, check_template, engine_argv
from specledger.probe.engine_server import EngineServer, free_port
from specledger.probe.launch_runs import SpecRun, merge_repeats
from specledger.probe.loadgen import LoadConfig, Tokenizer
from specledger.probe.workload import ProbeWorkload
from specledger.rundir import RunDir, json_safe

LAUNCH_DIR = "launch"
PLAN_NAME = "plan.json"


def run_order(specs: Sequence[Spec], repeat: int = 0) -> list[Spec]:
    """``off`` first, then the others in the order given; every other repeat the reverse (A B, B A, A B, ...),
    so that whatever drifts with time (the machine warming, a neighbour's load) falls on every configuration
    alike, as the local side-by-side alternates its turns."""
    order = [s for s in specs if s.is_baseline] + [s for s in specs if not s.is_baseline]
    return order if repeat % 2 == 0 else order[::-1]


def saved_name(spec: Spec, repeat: int) -> str:
    """``NAME.json`` for the first repeat, ``NAME.rep<R>.json`` after it."""
    return f"{spec.name}.json" if repeat == 0 else f"{spec.name}.rep{repeat}.json"


Progress = Callable[[str], None]


def probe_spec(template: str, spec: Spec, loads: Sequence[int], config: LoadConfig, items: list[Any], folder: Path,
               *, port: int | None, ready_timeout_s: float, tokenizer: Tokenizer | None,
               progress: Progress | None = None, repeat: int = 0, tag: str | None = None) -> SpecRun:
    """Start the engine of ``spec``, probe it at every load, stop it; a death is a one-line error. Its log is
    ``logs/NAME.log`` (``logs/NAME.rep<R>.log`` for a later repeat, ``logs/NAME.<tag>.log`` with a ``tag``:
    a race round)."""
    chosen = port if port is not None else free_port()
    argv = engine_argv(template, chosen, spec)
    log_name = (f"{spec.name}.{tag}.log" if tag else Path(saved_name(spec, repeat)).with_suffix(".log").name)
    server = EngineServer(spec.name, argv, chosen, folder / "logs" / log_name)
    say = progress or (lambda _: None)
    say(f"{spec.name}: starting {shlex.join(argv)} (log {server.log_path})")
    server.start()
    try:
        ready = server.wait_ready(ready_timeout_s)
        say(f"{spec.name}: ready after {ready:.1f} s")

        def check(load: int, _role: str) -> None:
            if server.exit_code() is not None:
                raise server.died(f"during the run (before load {load})")
            say(f"{spec.name}: load {load}")

        try:
            points = run_probe_loads(server.url, config, items, loads, metrics=True, tokenizer=tokenizer,
                                     progress=check)
        except SpecLedgerError:
            if server.exit_code() is not None:
                raise server.died("during the run") from None
            raise
        if server.exit_code() is not None:
            raise server.died("during the run")
    finally:
        server.stop()
    return SpecRun(spec, argv, str(server.log_path), round(ready, 3), points)


class _PlanKeys(TypedDict):
    """The keys every :class:`PlanDocument` has."""

    launch: str  # the command template
    specs: dict[str, list[str]]  # configuration -> its arguments
    loads: list[int]
    prompts: list[str | None]  # the workload's prompt ids, in order
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    chat: bool
    requests: int
    model: str
    repeats: int


class PlanDocument(_PlanKeys, total=False):
    """``launch/plan.json``: what a resumed launch must share with the saved configurations."""

    race: bool  # --budget: the configurations are raced (any budget resumes)


def plan_document(template: str, specs: Sequence[Spec], loads: Sequence[int], config: LoadConfig,
                  workload: ProbeWorkload, repeats: int = 1) -> PlanDocument:
    """What a resumed run must share with the saved configurations."""
    return {"launch": template, "specs": {s.name: list(s.args) for s in specs}, "loads": sorted(set(loads)),
            "prompts": [item.id for item in workload.items], "max_tokens": config.max_tokens,
            "temperature": config.temperature, "top_p": config.top_p, "seed": config.seed, "chat": config.chat,
            "requests": config.num_requests, "model": config.model, "repeats": repeats}


def check_plan(folder: Path, plan: PlanDocument) -> None:
    """``folder``'s saved plan must be ``plan`` (a resumed run); a new folder gets it."""
    path = folder / PLAN_NAME
    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            saved = None
        if saved != json_safe(plan):
            raise SpecLedgerError(f"{path.parent.parent} holds a launch with other settings ({path}); pass a new "
                                  "--out, or the same command to resume it")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        RunDir(folder).write(PLAN_NAME, plan)


def run_launch(template: str, specs: Sequence[Spec], loads: Sequence[int], config: LoadConfig,
               workload: ProbeWorkload, out: Path, *, port: int | None = None, ready_timeout_s: float = 600.0,
               tokenizer: Tokenizer | None = None, progress: Progress | None = None,
               repeats: int = 1) -> dict[str, SpecRun]:
    """Every configuration, ``repeats`` times, in :func:`run_order` of each repeat (alternating), each saved as
    it finishes (a saved one is read back, not run again); returns them by name, the repeats merged
    (:func:`merge_repeats`)."""
    check_template(template)
    if repeats < 1:
        raise SpecLedgerError(f"--repeats {repeats}: give 1 or more")
    folder = Path(out) / LAUNCH_DIR
    check_plan(folder, plan_document(template, specs, loads, config, workload, repeats))
    done: dict[str, list[SpecRun]] = {s.name: [] for s in specs}
    for repeat in range(repeats):
        for spec in run_order(specs, repeat):
            saved = folder / saved_name(spec, repeat)
            if saved.is_file():
                done[spec.name].append(SpecRun.from_dict(RunDir(folder).read(saved.name)))
                if progress:
                    progress(f"{spec.name} (repeat {repeat + 1}): finished before, read from {saved}")
                continue
            if progress and repeats > 1:
                progress(f"{spec.name}: repeat {repeat + 1} of {repeats}")
            run = probe_spec(template, spec, loads, config, workload.items, folder, port=port,
                             ready_timeout_s=ready_timeout_s, tokenizer=tokenizer, progress=progress, repeat=repeat)
            RunDir(folder).write(saved.name, run.to_dict())
            done[spec.name].append(run)
    return {name: merge_repeats(runs) for name, runs in done.items()}


__all__ = ["LAUNCH_DIR", "PLAN_NAME", "PlanDocument", "Progress", "check_plan", "plan_document", "probe_spec",
           "run_launch", "run_order", "saved_name"]
